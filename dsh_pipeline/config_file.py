"""The configuration file (TOML, ``--config FILE`` or ``$DSH_CONFIG``).

One table for the cluster, one per command::

    [kafka]                  # the DSH_KAFKA_* variables, lower case, without the prefix
    bootstrap = "kafka-1:9093,kafka-2:9093"
    security_protocol = "SASL_SSL"
    sasl_mechanism = "SCRAM-SHA-512"
    sasl_username = "dsh"
    sasl_password_file = "/run/secrets/kafka-password"
    ssl_cafile = "/etc/ssl/kafka-ca.pem"

    [project]                # the command's long options, "-" written "_"
    store = "/data/views.sqlite"
    metrics_port = 9100
    session_timeout = 30

A flag wins over an environment variable, which wins over the file, which
wins over the default. Secrets stay out of the file (``sasl_password_file``
names one; there is no ``sasl_password`` key). An unknown table or key, or a
value of the wrong type, is an error naming the file, the table and the key.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from pathlib import Path
from typing import Any, Mapping

from dsh_core.errors import PipelineError

__all__ = ["CONFIG_ENV", "KAFKA_KEYS", "CommandParser", "apply_config"]

CONFIG_ENV = "DSH_CONFIG"
#: ``[kafka]`` keys and the variables they stand for.
KAFKA_KEYS = {key: f"DSH_KAFKA_{key.upper()}" for key in (
    "bootstrap", "security_protocol", "sasl_mechanism", "sasl_username", "sasl_password_file",
    "sasl_oauth_token_file", "sasl_oauth_token_command", "ssl_cafile", "ssl_certfile", "ssl_keyfile")}

#: ``[kafka]`` keys naming a file: one not there is named by the key that gave it, not by its variable.
_FILE_KEYS = {"sasl_password_file", "sasl_oauth_token_file", "ssl_cafile", "ssl_certfile", "ssl_keyfile"}


class CommandParser(argparse.ArgumentParser):
    """A command's parser, which says what options it has (by ``dest``)."""

    def options(self) -> dict[str, argparse.Action]:
        """The options a configuration file may set: single-valued ones
        (a repeated option such as ``--prompt`` stays on the command line)."""
        return {action.dest: action for action in self._actions
                if action.option_strings and action.dest != "help" and not isinstance(action, argparse._AppendAction)}


def apply_config(path: str | None, commands: Mapping[str, CommandParser],
                 environ: os._Environ | dict[str, str]) -> None:
    """Read the file at ``path`` (``None``: ``$DSH_CONFIG``, else nothing):
    its command tables become those commands' defaults, its ``[kafka]``
    table the ``DSH_KAFKA_*`` variables not already set in ``environ``."""
    path = path or environ.get(CONFIG_ENV)
    if not path:
        return
    try:
        with open(path, "rb") as stream:
            tables = tomllib.load(stream)
    except OSError as error:
        raise PipelineError(f"{path}: cannot read the configuration file: {error.strerror or error}") from None
    except tomllib.TOMLDecodeError as error:
        raise PipelineError(f"{path}: not a TOML file: {error}") from None
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise PipelineError(f"{path}: {name} = … outside a table; options go in [kafka] or a command's table")
        if name == "kafka":
            _kafka(Path(path), table, environ)
        elif name in commands:
            _command(Path(path), name, table, commands[name])
        else:
            raise PipelineError(f"{path}: [{name}] is not kafka or a command ({', '.join(sorted(commands))})")


def _kafka(path: Path, table: dict[str, Any], environ: os._Environ | dict[str, str]) -> None:
    for key, value in table.items():
        variable = KAFKA_KEYS.get(key)
        if variable is None:
            raise PipelineError(f"{path}: [kafka] {key} is not a key of it ({', '.join(KAFKA_KEYS)})")
        if not isinstance(value, str):
            raise PipelineError(f"{path}: [kafka] {key} must be a string, got {value!r}")
        if key == "sasl_password_file" and environ.get("DSH_KAFKA_SASL_PASSWORD"):
            continue  # the environment's password wins over the file's password file
        if variable in environ:
            continue  # the environment wins
        if key in _FILE_KEYS and not os.path.isfile(value):
            raise PipelineError(f"{path}: [kafka] {key} = {value!r}: no such file")
        environ[variable] = value


def _command(path: Path, name: str, table: dict[str, Any], parser: CommandParser) -> None:
    options = parser.options()
    for key, value in table.items():
        action = options.get(key)
        if key in _ELSEWHERE:
            raise PipelineError(f"{path}: [{name}] {key}: {_ELSEWHERE[key]}")
        if action is None:
            raise PipelineError(f"{path}: [{name}] {key} is not an option of `dsh-pipeline {name}` "
                                f"({', '.join(sorted(options))})")
        if not _fits(action, value):
            raise PipelineError(f"{path}: [{name}] {key} = {value!r} is not what --{key.replace('_', '-')} takes")
        parser.set_defaults(**{key: value})
        action.required = False  # the file gave it


#: Options a command table may not set, and where they go instead (so a
#: variable keeps winning over the file).
_ELSEWHERE = {"bootstrap": "the cluster's address goes in [kafka] (where DSH_KAFKA_BOOTSTRAP wins over it)",
              "model_url": "the model endpoint comes from --model-url or DEEPSEEK_BASE_URL"}


def _fits(action: argparse.Action, value: Any) -> bool:
    if action.nargs == 0:  # a switch (store_true)
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if action.type is int:
        return isinstance(value, int)
    if action.type is float:
        return isinstance(value, (int, float))
    return isinstance(value, str) and (action.choices is None or value in action.choices)
