"""AWS credentials: where the caller's keys come from, and what a head VM's controller needs.

Standard library only (no libcloud, no EC2 provider): the S3 checkpoint store in forked training
workers reads its keys here too.
"""

from __future__ import annotations

import configparser
import os
from pathlib import Path

from spotrun.providers.base import environ_matching

from spotrun.errors import ProviderError

# The environment the provider reads, by name or (ending in '_') prefix.
ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "SPOTRUN_AWS_",
)


def keys() -> tuple[str, str, str | None]:
    """(access key, secret, session token) from the environment, else ~/.aws/credentials.

    Raises ProviderError naming what to set when neither has them."""
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if key and secret:
        return key, secret, os.environ.get("AWS_SESSION_TOKEN") or None
    path = Path(os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or Path.home() / ".aws" / "credentials").expanduser()
    profile = os.environ.get("AWS_PROFILE") or "default"
    parser = configparser.ConfigParser()
    try:
        parser.read(path)
    except configparser.Error as exc:
        raise ProviderError(f"cannot read AWS credentials file {path}: {exc}") from exc
    if parser.has_option(profile, "aws_access_key_id") and parser.has_option(profile, "aws_secret_access_key"):
        return (
            parser.get(profile, "aws_access_key_id"),
            parser.get(profile, "aws_secret_access_key"),
            parser.get(profile, "aws_session_token", fallback=None),
        )
    raise ProviderError(
        "no AWS credentials found",
        hint=f"set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or add profile [{profile}] to {path}",
    )


def head_env(secrets_dir: str) -> tuple[dict[str, str], dict[str, bytes]]:
    """(environment, files) a head VM's controller needs to call AWS: this machine's AWS
    variables, with keys found in ~/.aws/credentials resolved into them (the head has no such
    file). Raises ProviderError when there are no keys."""
    del secrets_dir  # AWS ships no files
    env = environ_matching(ENV, os.environ)
    key_id, secret, token = keys()
    env.update(
        {
            "AWS_ACCESS_KEY_ID": key_id,
            "AWS_SECRET_ACCESS_KEY": secret,
            **({"AWS_SESSION_TOKEN": token} if token else {}),
        }
    )
    return env, {}
