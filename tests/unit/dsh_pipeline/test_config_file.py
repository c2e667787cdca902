"""The configuration file: tables per command and for the cluster; flags win
over variables, variables over the file, the file over defaults."""

from __future__ import annotations

import pytest

from dsh_core.errors import PipelineError
from dsh_pipeline.cli import build_parser, main
from dsh_pipeline.config_file import apply_config


def _parsed(tmp_path, text: str, argv: list[str], environ: dict | None = None):
    path = tmp_path / "dsh.toml"
    path.write_text(text)
    parser = build_parser()
    apply_config(str(path), parser.commands, {} if environ is None else environ)
    return parser.parse_args(argv)


def test_a_command_table_gives_defaults_a_flag_overrides(tmp_path):
    text = '[project]\nstore = "/data/views.sqlite"\nmetrics_port = 9100\nsession_timeout = 30\nno_create_topics = true\n'
    args = _parsed(tmp_path, text, ["project"])
    assert (args.store, args.metrics_port, args.session_timeout, args.no_create_topics) == (
        "/data/views.sqlite", 9100, 30, True)
    assert _parsed(tmp_path, text, ["project", "--metrics-port", "9200"]).metrics_port == 9200
    assert _parsed(tmp_path, text, ["audit"]).metrics_port == 0  # another command's table is its own


def test_a_required_option_may_come_from_the_file(tmp_path):
    assert _parsed(tmp_path, '[ship]\nroot = "/sessions"\n', ["ship"]).root == "/sessions"


def test_the_kafka_table_fills_the_variables_not_set(tmp_path):
    secret = tmp_path / "kafka-password"
    secret.write_text("pw\n")
    environ = {"DSH_KAFKA_SASL_USERNAME": "from-the-environment"}
    _parsed(tmp_path, '[kafka]\nbootstrap = "k1:9093,k2:9093"\nsecurity_protocol = "SASL_SSL"\n'
                      f'sasl_username = "from-the-file"\nsasl_password_file = "{secret}"\n', ["project"], environ)
    assert environ == {"DSH_KAFKA_BOOTSTRAP": "k1:9093,k2:9093", "DSH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                       "DSH_KAFKA_SASL_USERNAME": "from-the-environment", "DSH_KAFKA_SASL_PASSWORD_FILE": str(secret)}
    environ = {"DSH_KAFKA_SASL_PASSWORD": "from-the-environment"}  # wins over the file's password file
    _parsed(tmp_path, '[kafka]\nsasl_password_file = "/run/secrets/kafka"\n', ["project"], environ)
    assert environ == {"DSH_KAFKA_SASL_PASSWORD": "from-the-environment"}


@pytest.mark.parametrize("key", ["ssl_cafile", "ssl_certfile", "ssl_keyfile", "sasl_password_file",
                                 "sasl_oauth_token_file"])
def test_a_file_the_kafka_table_names_that_is_not_there_is_named_by_its_key(tmp_path, key, capsys):
    path = tmp_path / "dsh.toml"
    path.write_text(f'[kafka]\n{key} = "/nonexistent/kafka.pem"\n')  # nothing set before it is refused
    assert main(["--config", str(path), "simulate"]) == 2
    assert capsys.readouterr().err == (f"dsh-pipeline: PipelineError: {path}: [kafka] {key} = "
                                       "'/nonexistent/kafka.pem': no such file\n")
    environ = {f"DSH_KAFKA_{key.upper()}": "/from/the/environment"}  # which wins, and is checked where it is used
    _parsed(tmp_path, path.read_text(), ["simulate"], environ)
    assert environ[f"DSH_KAFKA_{key.upper()}"] == "/from/the/environment"


@pytest.mark.parametrize(("text", "message"), [
    ("[projector]\ndb = 'x'\n", r"\[projector\] is not kafka or a command \(acls, archive, audit"),
    ("[project]\ndatabase = 'x'\n", r"\[project\] database is not an option of `dsh-pipeline project` \("),
    ("[project]\nmetrics_port = '9100'\n", r"\[project\] metrics_port = '9100' is not what --metrics-port takes"),
    ("[project]\nlog_level = 'LOUD'\n", r"\[project\] log_level = 'LOUD' is not what --log-level takes"),
    ("[kafka]\nsasl_password = 'x'\n", r"\[kafka\] sasl_password is not a key of it \(bootstrap, "),
    ("[project]\nbootstrap = 'x:9092'\n", r"\[project\] bootstrap: the cluster's address goes in \[kafka\]"),
    ("[worker]\nprompt = 'hi'\n", r"\[worker\] prompt is not an option of `dsh-pipeline worker`"),
    ("db = 'x'\n", r"db = … outside a table"),
    ("[project\n", r"not a TOML file"),
])
def test_a_wrong_file_is_named_with_its_table_and_key(tmp_path, text, message):
    with pytest.raises(PipelineError, match=message):
        _parsed(tmp_path, text, ["project"])


def test_the_cli_says_so_and_exits_with_the_usage_code(tmp_path, capsys):
    path = tmp_path / "dsh.toml"
    path.write_text("[project]\ndatabase = 'x'\n")
    assert main(["--config", str(path), "view", "s"]) == 2
    assert capsys.readouterr().err.startswith(f"dsh-pipeline: PipelineError: {path}: [project] database is not an "
                                              "option of `dsh-pipeline project`")
    assert main(["--config", str(tmp_path / "missing.toml"), "view", "s"]) == 2


def test_json_log_lines_are_one_object_each(capsys):
    import json
    import logging

    from dsh_pipeline.log_lines import configure_logging
    configure_logging("INFO", "json")
    try:
        logging.getLogger("dsh.projector").info("assigned %d partitions", 3)
        try:
            raise ValueError("bad")
        except ValueError:
            logging.getLogger("dsh.projector").exception("stopped")
        logging.getLogger("aiokafka").info("not shown below WARNING")
        lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    finally:
        configure_logging("INFO", "text")
    assert [(line["level"], line["logger"], line["message"]) for line in lines] == [
        ("INFO", "dsh.projector", "assigned 3 partitions"), ("ERROR", "dsh.projector", "stopped")]
    assert "ValueError: bad" in lines[1]["error"] and lines[0]["time"].endswith("+00:00")
