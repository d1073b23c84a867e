import pytest

from sglang_histospec import cli


def test_every_registered_command_has_help(capsys):
    assert cli.build_parser().prog == "histospec"
    for path, module in cli.COMMAND_MODULES.items():
        with pytest.raises(SystemExit) as e:
            cli.main([*path, "--help"])
        assert e.value.code == 0, module
        assert " ".join(path) in capsys.readouterr().out


def test_no_command_prints_help(capsys):
    assert cli.main([]) == 2
    assert "histospec" in capsys.readouterr().out


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert "histospec 0.1.0" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flags,expected",
    [
        ([], ("anchors", True, 4, 1)),
        (["--draft-mode", "chain"], ("counts", False, 4, 1)),
        (["--scorer", "counts", "--history-window", "1"], ("counts", True, 1, 1)),
        (["--draft-threads", "3"], ("anchors", True, 4, 3)),
    ],
)
def test_serve_drafter_flags(flags, expected):
    from sglang_histospec.commands import serve

    args = cli.build_parser().parse_args(["serve", "--model", "m", *flags])
    cfg = serve._drafter_config(args)
    assert (cfg.scorer, cfg.tree, cfg.window, cfg.draft_threads) == expected


def test_serve_bad_draft_threads_names_the_fix():
    from sglang_histospec.commands import serve

    args = cli.build_parser().parse_args(["serve", "--model", "m", "--draft-threads", "0"])
    with pytest.raises(ValueError, match=r"draft_threads=0: expected an int >= 1"):
        serve._drafter_config(args)


def test_serve_chain_with_anchors_names_the_fix():
    from sglang_histospec.commands import serve

    args = cli.build_parser().parse_args(["serve", "--model", "m", "--scorer", "anchors", "--draft-mode", "chain"])
    with pytest.raises(ValueError, match="set scorer='counts'"):
        serve._drafter_config(args)


@pytest.mark.parametrize("command", [["serve", "--model", "m"], ["bench", "engine"], ["demo"]])
def test_draft_selection_flag_is_shared(command, capsys):
    """serve, bench engine and demo take the same --draft-selection (EngineConfig.draft_selection), default
    adaptive; the old names are gone."""
    parser = cli.build_parser()
    assert parser.parse_args(command).draft_selection == "adaptive"
    assert parser.parse_args([*command, "--draft-selection", "always"]).draft_selection == "always"
    for old in ("cost", "all"):
        with pytest.raises(SystemExit):
            parser.parse_args([*command, "--draft-selection", old])
    assert "invalid choice: 'all' (choose from 'adaptive', 'always')" in capsys.readouterr().err
