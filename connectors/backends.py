"""Every fsspec protocol, and what its options send to a host: the table the service's spec policy
reads before a spec sent over HTTP may open storage.

A backend's *credential options* carry a secret to its host; its *endpoint options* choose that
host (or a proxy on the way). A spec that uses a server credential may set no endpoint option,
so the credential goes only where the operator configured. Protocols not opened over HTTP
either read ambient credentials of the server (``hf`` reads ``HF_TOKEN``, ``github`` a token,
``dbfs`` a workspace token), reach hosts a prefix cannot confine (``reference``, ``ftp``,
``sftp``, ``webhdfs``, ``smb``), or wrap another filesystem (``simplecache``, ``zip``,
``dir``): they stay with the operator's own CLI runs. A protocol missing from this table (a
new fsspec release, a plugin) is refused until it is listed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backend:
    over_http: bool  # may a spec posted to the service name it (under an allowed prefix)
    credential_options: frozenset[str] = frozenset()
    endpoint_options: frozenset[str] = frozenset()
    why: str = ""  # for a refused one: what it would reach


def _b(over_http: bool, credentials: str = "", endpoints: str = "", why: str = "") -> Backend:
    return Backend(over_http, frozenset(credentials.split()), frozenset(endpoints.split()), why)


_S3 = _b(True, "key secret token profile anon aws_access_key_id aws_secret_access_key aws_session_token",
         "endpoint_url client_kwargs.endpoint_url config_kwargs.proxies s3_additional_kwargs")
_GS = _b(True, "token project access", "endpoint_url")
_AZ = _b(True, "account_key sas_token connection_string credential client_secret client_id tenant_id account_name",
         "account_host connection_string")
_HTTP = _b(True, "headers auth client_kwargs.auth client_kwargs.headers", "client_kwargs.proxy client_kwargs.trust_env")
_LOCAL = _b(True)
_WRAPS = "wraps another filesystem, named in its options"

BACKENDS: dict[str, Backend] = {
    "file": _LOCAL, "local": _LOCAL, "memory": _LOCAL,
    "s3": _S3, "s3a": _S3, "gs": _GS, "gcs": _GS, "az": _AZ, "abfs": _AZ, "adl": _AZ,
    "http": _HTTP, "https": _HTTP,
    "asynclocal": _b(False, why="the server's disk, outside the local-path checks"),
    "async_wrapper": _b(False, why=_WRAPS), "asyncwrapper": _b(False, why=_WRAPS),
    "blockcache": _b(False, why=_WRAPS), "cached": _b(False, why=_WRAPS), "filecache": _b(False, why=_WRAPS),
    "simplecache": _b(False, why=_WRAPS), "dir": _b(False, why=_WRAPS), "generic": _b(False, why=_WRAPS),
    "zip": _b(False, why=_WRAPS), "tar": _b(False, why=_WRAPS), "libarchive": _b(False, why=_WRAPS),
    "reference": _b(False, why="references name any URL on any filesystem"),
    "data": _b(False, why="the data is in the URL itself"),
    "arrow_hdfs": _b(False, "kerb_ticket", "host port", "the cluster's Kerberos ticket"),
    "hdfs": _b(False, "kerb_ticket", "host port", "the cluster's Kerberos ticket"),
    "webhdfs": _b(False, "kerb password token", "host port proxy_to", "any host the spec names"),
    "dbfs": _b(False, "token", "instance", "a Databricks workspace token"),
    "dask": _b(False, why="the Dask cluster's workers"),
    "ftp": _b(False, "username password", "host port", "any host the spec names"),
    "sftp": _b(False, "username password pkey key_filename", "host port", "any host; the server's SSH keys"),
    "ssh": _b(False, "username password pkey key_filename", "host port", "any host; the server's SSH keys"),
    "smb": _b(False, "username password", "host port", "any host the spec names"),
    "webdav": _b(False, "auth", "base_url", "any host the spec names"),
    "github": _b(False, "username token", "", "the server's GitHub token"),
    "gist": _b(False, "username token", "", "the server's GitHub token"),
    "git": _b(False, why="the server's git repositories"),
    "hf": _b(False, "token", "endpoint", "the server's Hugging Face token (HF_TOKEN)"),
    "jupyter": _b(False, "tok", "url", "a Jupyter server's token"), "jlab": _b(False, why="the server's JupyterLab"),
    "dropbox": _b(False, "token", "", "a Dropbox token"), "box": _b(False, "oauth client", "", "a Box token"),
    "gdrive": _b(False, "token creds", "", "Google Drive credentials"),
    "oci": _b(False, "config signer", "", "the server's OCI config"),
    "ocilake": _b(False, "config signer", "", "the server's OCI config"),
    "oss": _b(False, "key secret token", "endpoint", "Alibaba OSS credentials"),
    "tos": _b(False, "key secret", "endpoint", "Volcengine TOS credentials"),
    "tosfs": _b(False, "key secret", "endpoint", "Volcengine TOS credentials"),
    "lakefs": _b(False, "username password", "host", "lakeFS credentials"),
    "dvc": _b(False, why="the server's DVC remotes"), "wandb": _b(False, "api_key", "", "a W&B key"),
    "root": _b(False, why="XRootD servers"), "pyscript": _b(False, why="a browser runtime"),
}


def backend_for(protocol: str) -> Backend | None:
    return BACKENDS.get(protocol.lower())
