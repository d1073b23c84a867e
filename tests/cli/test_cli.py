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
