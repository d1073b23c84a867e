"""TRL integration: HistoSpecGRPOTrainer and its client."""
