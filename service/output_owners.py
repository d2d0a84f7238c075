"""Which key's jobs wrote which output folder, kept in the service's storage for every later job.

A lease (``connectors.lease``) guards an output only while a run holds it; a team's results
must stay its own after. The first job a key posts with an output folder claims that folder for
the key (``owners/<sha256 of its normal URL>.json`` in the storage: the URL and the owner's key
hash). A job of another key may then neither write into the folder, above it nor below it, nor
read from it. One server owns its storage (as the README requires), so claims are kept in
memory after one read, and a lock makes "check, then claim" one step.
"""

from __future__ import annotations

import hashlib
import threading

from connectors import join_url
from connectors.blobs import read_json_folder, write_json
from connectors.url_policy import NormalURL, normal_url
from service.errors import bad_request


class OutputOwners:
    def __init__(self, storage_url: str, storage_options: dict | None = None) -> None:
        self.folder = join_url(storage_url, "owners")
        self.storage_options = storage_options
        self._lock = threading.Lock()
        self._claims: list[tuple[NormalURL, str]] | None = None

    def _all(self) -> list[tuple[NormalURL, str]]:
        if self._claims is None:
            self._claims = [(normal_url(c["url"]), c["owner"])
                            for c in read_json_folder(self.folder, self.storage_options)]
        return self._claims

    def _other(self, where: NormalURL, owner: str) -> NormalURL | None:
        """Another key's claimed folder that ``where`` lies in or holds."""
        for claimed, holder in self._all():
            if holder != owner and (where.within(claimed) or claimed.within(where)):
                return claimed
        return None

    def check_read(self, url: str, owner: str, param: str) -> None:
        with self._lock:
            other = self._other(normal_url(url), owner)
        if other is not None:
            raise bad_request(f"{param}: {url} reaches {other.url}, another key's job output", param,
                              "output_owned")

    def claim(self, url: str, owner: str, param: str = "output.url") -> None:
        """Claim ``url`` for ``owner``, or a 400 if another key's output overlaps it."""
        where = normal_url(url)
        with self._lock:
            other = self._other(where, owner)
            if other is not None:
                raise bad_request(f"{param}: {url} overlaps {other.url}, another key's job output; choose "
                                  "another folder", param, "output_owned")
            if any(claimed == where for claimed, _ in self._all()):
                return
            name = hashlib.sha256(where.url.encode()).hexdigest()[:32]
            write_json(join_url(self.folder, f"{name}.json"), {"url": where.url, "owner": owner},
                       self.storage_options)
            self._all().append((where, owner))
