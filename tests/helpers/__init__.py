"""Test helpers shared by the test folders: tiny models, engine stubs, server and TRL harnesses."""
