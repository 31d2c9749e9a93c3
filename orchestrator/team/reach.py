"""What of the team's store lies within a job's reach on this machine, for the sandbox to hide (pure: no I/O but
reading the daemon's own environment it is given).

A node's connection to PostgreSQL is made of a server address and a credential. A job runs as the daemon's user,
so whatever libpq or asyncpg would find for the daemon a job could find too, unless the sandbox hides it:

- the server's UNIX socket dirs: the `host=` of `[store] url` (in its query or its host part, percent-encoded, a
  comma list), `PGHOST`, and the distributions' defaults (`/run/postgresql`, `/var/run/postgresql`; `/tmp` is
  always emptied for a job). Over a socket a role may log in without a password (`peer`, `trust`);
- the files holding a password or a key: `~/.pgpass` and `PGPASSFILE`, the service files (`~/.pg_service.conf`,
  `PGSERVICEFILE`), the client certificates dir (`~/.postgresql`), and the files the URL or `PGSSL*` name;
- the team's other shared store, its remote: the credentials the node pushes with (`~/.ssh`, git's stored
  credentials, `~/.netrc`, the GitHub CLI's token, the ssh agent's socket). A job that had them could push to the
  shared branch itself.

The daemon's `PG*` variables never reach a job (`proc.process.environment`), nor does its config dir (the URL)
or env file (the password): see `docs/team.md` for what stays reachable (a server over TCP) and how to close it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

DEFAULT_SOCKET_DIRS: tuple[str, ...] = ("/run/postgresql", "/var/run/postgresql")
"""Where a distribution's PostgreSQL puts its socket, and where libpq and asyncpg look without a `host`."""
HOME_FILES: tuple[str, ...] = (".pgpass", ".pg_service.conf", ".postgresql")
"""A user's libpq files: passwords, service definitions (which may hold passwords), client keys."""
PUSH_FILES: tuple[str, ...] = (".ssh", ".git-credentials", ".config/git/credentials", ".netrc", ".config/gh")
"""A user's credentials for the team's remote (ssh keys, git's `store` helper, netrc, GitHub CLI's token): with
them a job could push to the shared remote itself, past every seal, review and landing check."""
ENV_FILES: tuple[str, ...] = ("PGPASSFILE", "PGSERVICEFILE", "PGSSLKEY", "PGSSLCERT", "PGSSLROOTCERT", "PGSSLCRL")
"""Variables naming such a file elsewhere."""
URL_FILES: tuple[str, ...] = ("passfile", "sslkey", "sslcert", "sslrootcert", "sslcrl", "sslpassword")
"""Query parameters of a URL naming such a file (`sslpassword` is a secret itself: never a path, skipped)."""


def socket_dirs(url: str, environ: Mapping[str, str]) -> list[str]:
    """The UNIX socket dirs the store's connection may use: what the URL and PGHOST name, and the defaults."""
    hosts: list[str] = []
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    for spec in netloc.split(","):
        host = unquote(spec)
        if host.startswith("/"):
            hosts.append(re.sub(r":\d*$", "", host))  # `%2Frun%2Fpostgresql:5433`: a dir, then its port
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key == "host":
            hosts += [h for h in value.split(",") if h.startswith("/")]
    hosts += [h for h in environ.get("PGHOST", "").split(",") if h.startswith("/")]
    return list(dict.fromkeys([*hosts, *DEFAULT_SOCKET_DIRS]))


def credential_files(url: str, environ: Mapping[str, str], home: Path) -> list[str]:
    """The files that may hold the store's password or key: the user's libpq files, those PG* and the URL name."""
    files = [str(home / name) for name in (*HOME_FILES, *PUSH_FILES)]
    files += [environ[name] for name in ENV_FILES if environ.get(name)]
    if environ.get("XDG_CONFIG_HOME"):
        files.append(str(Path(environ["XDG_CONFIG_HOME"]) / "git" / "credentials"))
    if environ.get("SSH_AUTH_SOCK", "").startswith("/"):
        files.append(environ["SSH_AUTH_SOCK"])  # the agent that holds the keys the node pushes with
    query = dict(parse_qsl(urlsplit(url).query, keep_blank_values=True))
    files += [query[name] for name in URL_FILES if query.get(name) and name != "sslpassword"]
    return list(dict.fromkeys(files))


def hidden(url: str, environ: Mapping[str, str], homes: tuple[Path, ...]) -> tuple[str, ...]:
    """Every path a confined job must not see in team mode (dirs and files alike; what does not exist is skipped by
    the sandbox). `homes`: the daemon user's home dirs (its HOME and its passwd entry's, when they differ)."""
    if not url:
        return ()
    out = socket_dirs(url, environ)
    for home in dict.fromkeys(homes):
        out += credential_files(url, environ, home)
    return tuple(dict.fromkeys(out))
