"""L2: the knowledge base in Milvus: build it from a JSON-lines file, search it.

One code path for Milvus Lite (``uri`` is a local path ending in ``.db``) and a Milvus
server or cluster (``uri`` = ``http://host:19530``): the same ``pymilvus.MilvusClient``
calls, only publication and reader isolation differ.

Articles are JSON lines with ``id``, ``title``, ``text`` and optionally ``faq`` (bool)
and ``answer`` (the reply an FAQ article gives; default: its ``text``). An FAQ
article is embedded by its ``title`` (the question: what a customer's question is
compared with), any other as ``title + "\\n" + text``, with the pipeline's embedding
model, and stored with the COSINE metric, so a hit's ``score`` is the cosine
similarity. Measured on the sample tickets: embedding FAQ articles by question puts
77 of the 210 distinct tickets at or above 0.7 on the right FAQ (46 with title + text).

Builds are all or nothing. The file is read and checked and every article embedded
before Milvus is touched. Milvus Lite: the new database is written to a hidden sibling
folder and renamed into place (readers never see a half-written one). Server: the new
collection is written as ``<collection>__staging`` and renamed over the old one.

Milvus Lite runs inside the process that opens it and takes an exclusive lock on its
folder: two processes cannot open the same ``.db`` (measured: the second gets
``DataDirLockedError``). Spark runs several Python workers, so each reader process
opens a private copy of the published folder (a few MB, copied in milliseconds) and
copies it again when a rebuild publishes a new one. A Milvus server has no such limit:
every worker connects to it directly.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_ext.config import EmbeddingConfig, KnowledgeBaseConfig
from spark_ext.exceptions import InputFileError, KnowledgeBaseError
from spark_ext.sources.jsonl_input import non_empty_string, read_jsonl

if TYPE_CHECKING:
    import numpy as np

logger = logging.getLogger(__name__)

#: Longest ``text``/``answer`` in bytes (Milvus VARCHAR limit).
MAX_TEXT_BYTES = 65535
#: Longest ``id`` and ``title`` in bytes.
MAX_ID_BYTES, MAX_TITLE_BYTES = 512, 2048
#: Most query vectors in one Milvus search call (Milvus's ``nq`` limit).
MAX_NQ = 16384
#: Stored fields returned with each hit.
HIT_FIELDS: tuple[str, ...] = ("title", "text", "faq", "answer")


def is_server_uri(uri: str) -> bool:
    """``True`` for a Milvus server address, ``False`` for a Milvus Lite path.

    Example:
        >>> is_server_uri("http://milvus:19530"), is_server_uri("./sts-kb/kb.db")
        (True, False)
    """
    return "://" in uri


def _check_lite_path(uri: str) -> Path:
    path = Path(uri).expanduser()
    if path.suffix != ".db":
        raise KnowledgeBaseError(f"knowledge_base.uri={uri!r}: a Milvus Lite path must end "
                                 "in .db (or give a server address such as http://host:19530)")
    return path.absolute()


def _check_replaceable(path: Path) -> None:
    """A build replaces ``path``: only a Milvus Lite database (or nothing) may be there,
    never a file or folder of the user's that merely ends in ``.db``."""
    if path.exists() and not (path.is_dir() and (path / "collections").is_dir()):
        raise KnowledgeBaseError(f"{path} exists and is not a Milvus Lite database; "
                                 "choose another knowledge_base.uri (nothing was changed)")


def _bounded(limit: int) -> Any:
    def check(value: Any) -> str | None:
        if msg := non_empty_string(value):
            return msg
        if len(value.encode("utf-8")) > limit:
            return f"is longer than {limit} bytes"
        return None
    return check


def _is_bool(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"must be true or false, got {value!r}"


def read_articles(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The checked articles of a JSON-lines file (see the module docstring).

    Raises:
        InputFileError: Missing or empty file, or bad lines (with their numbers).
    """
    records = read_jsonl(path, required={"id": _bounded(MAX_ID_BYTES),
                                         "title": _bounded(MAX_TITLE_BYTES),
                                         "text": _bounded(MAX_TEXT_BYTES)},
                         optional={"faq": _is_bool, "answer": _bounded(MAX_TEXT_BYTES)},
                         unique="id", what="articles")
    return [{"id": r["id"], "title": r["title"], "text": r["text"],
             "faq": bool(r.get("faq", False)), "answer": r.get("answer") or r["text"]}
            for r in records]


def article_document(article: dict[str, Any]) -> str:
    """What is embedded for an article: an FAQ's question, else title and text.

    Example:
        >>> article_document({"title": "Do you ship to Japan?", "text": "Yes.", "faq": True})
        'Do you ship to Japan?'
        >>> article_document({"title": "Refunds", "text": "5 days.", "faq": False})
        'Refunds\\n5 days.'
    """
    return article["title"] if article.get("faq") else f"{article['title']}\n{article['text']}"


#: gRPC options of the Milvus client. pymilvus pings every 10 s; Milvus Lite's in-process
#: server may answer pings that often with "GOAWAY too_many_pings" and drop the connection
#: (seen in a benchmark run), so clients ping every 5 minutes (gRPC servers' default minimum).
_GRPC_OPTIONS = {"grpc.keepalive_time_ms": 300_000}


class _UnimplementedRpcNoise(logging.Filter):
    """Drop gRPC's ERROR with traceback for an RPC Milvus Lite's in-process server lacks
    (pymilvus asks it for ``AllocTimestamp`` on connect: "Method not implemented!").
    Harmless, expected at every open, and it reads like a failure in a good run."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, NotImplementedError) and "not implemented" in str(exc))


def quiet_library_noise() -> None:
    """Keep the knowledge base's libraries' harmless start-up chatter off a command's
    output: faiss's CPU-feature probing (an INFO ``ModuleNotFoundError`` for the AVX512
    build it falls back from), Milvus Lite's unimplemented-RPC tracebacks. Idempotent."""
    for name in ("faiss", "faiss.loader", "milvus_lite", "sentence_transformers"):
        logging.getLogger(name).setLevel(logging.WARNING)
    server = logging.getLogger("grpc._server")
    if not any(isinstance(f, _UnimplementedRpcNoise) for f in server.filters):
        server.addFilter(_UnimplementedRpcNoise())


def _client(uri: str, token: str = "") -> Any:
    from pymilvus import MilvusClient
    from pymilvus.exceptions import MilvusException

    quiet_library_noise()
    try:
        return MilvusClient(uri=uri, token=token, grpc_options=_GRPC_OPTIONS) if token \
            else MilvusClient(uri=uri, grpc_options=_GRPC_OPTIONS)
    except MilvusException as e:
        hint = (" (a Milvus Lite folder can be open in one process only)"
                if not is_server_uri(uri) else "")
        raise KnowledgeBaseError(f"cannot open Milvus at {uri}: {e.message}{hint}") from e


def _release_lite(path: Path) -> None:
    """Stop Milvus Lite's in-process server for ``path`` (``close()`` keeps its lock)."""
    try:
        from milvus_lite import server_manager_instance
    except ImportError:
        return
    server_manager_instance.release_server(str(path))


def _create_collection(client: Any, name: str, dim: int) -> None:
    from pymilvus import DataType

    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=MAX_ID_BYTES)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
    schema.add_field("title", DataType.VARCHAR, max_length=MAX_TITLE_BYTES)
    schema.add_field("text", DataType.VARCHAR, max_length=MAX_TEXT_BYTES)
    schema.add_field("faq", DataType.BOOL)
    schema.add_field("answer", DataType.VARCHAR, max_length=MAX_TEXT_BYTES)
    index = client.prepare_index_params()
    index.add_index("vector", metric_type="COSINE", index_type="FLAT")
    client.create_collection(name, schema=schema, index_params=index)


def _fill(client: Any, name: str, articles: list[dict[str, Any]], vectors: "np.ndarray",
          chunk: int = 1000) -> None:
    rows = [{**a, "vector": v.tolist()} for a, v in zip(articles, vectors)]
    for i in range(0, len(rows), chunk):
        client.insert(name, rows[i:i + chunk])


@dataclass(frozen=True)
class BuildReport:
    """What :func:`build_knowledge_base` did."""

    uri: str
    collection: str
    articles: int
    faq: int
    dim: int
    seconds: float


def build_knowledge_base(input_path: str | os.PathLike[str], kb: KnowledgeBaseConfig,
                         embedding: EmbeddingConfig) -> BuildReport:
    """Create or replace the collection ``kb.collection`` at ``kb.uri`` from a file.

    Idempotent: the same file gives the same collection; articles no longer in the
    file are gone after a rebuild. Nothing is written unless the whole file is good.

    Raises:
        InputFileError: Missing or empty file, or bad lines (with their numbers).
        KnowledgeBaseError: Milvus cannot be opened or written.
    """
    from spark_ext.l1.embedding import embed_texts

    start = time.monotonic()
    articles = read_articles(input_path)
    if not is_server_uri(kb.uri):
        _check_replaceable(_check_lite_path(kb.uri))
    vectors = embed_texts([article_document(a) for a in articles], embedding)
    dim = int(vectors.shape[1])
    if is_server_uri(kb.uri):
        _publish_server(kb, articles, vectors, dim)
    else:
        _publish_lite(kb, articles, vectors, dim)
    report = BuildReport(kb.uri, kb.collection, len(articles),
                         sum(a["faq"] for a in articles), dim, time.monotonic() - start)
    logger.info("Built knowledge base %s/%s: %d articles.", kb.uri, kb.collection,
                report.articles)
    return report


def _publish_lite(kb: KnowledgeBaseConfig, articles: list[dict[str, Any]],
                  vectors: "np.ndarray", dim: int) -> None:
    path = _check_lite_path(kb.uri)
    _check_replaceable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.stem}.building-{os.getpid()}.db")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        if path.exists():  # other collections of the same database are kept
            shutil.copytree(path, staging, ignore=shutil.ignore_patterns("LOCK"))
        client = _client(str(staging))
        try:
            if client.has_collection(kb.collection):
                client.drop_collection(kb.collection)
            _create_collection(client, kb.collection, dim)
            _fill(client, kb.collection, articles, vectors)
            client.flush(kb.collection)
        finally:
            client.close()
            _release_lite(staging)
        old = path.with_name(f".{path.stem}.old-{os.getpid()}.db")
        if path.exists():
            os.rename(path, old)
        os.rename(staging, path)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _publish_server(kb: KnowledgeBaseConfig, articles: list[dict[str, Any]],
                    vectors: "np.ndarray", dim: int) -> None:
    client = _client(kb.uri, kb.token)
    staging = f"{kb.collection}__staging"
    try:
        if client.has_collection(staging):
            client.drop_collection(staging)
        _create_collection(client, staging, dim)
        _fill(client, staging, articles, vectors)
        client.flush(staging)
        if client.has_collection(kb.collection):
            client.drop_collection(kb.collection)
        client.rename_collection(staging, kb.collection)
    finally:
        client.close()


# ------------------------------------------------------------------ reading


def _generation(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


_SNAPSHOT_ROOT = Path(tempfile.gettempdir()) / "sts-kb-readers"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_snapshots() -> None:
    """Remove the copies of reader processes that are gone."""
    if not _SNAPSHOT_ROOT.is_dir():
        return
    for d in _SNAPSHOT_ROOT.iterdir():
        pid = d.name.split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


class KnowledgeBaseReader:
    """An open knowledge base for searching (one per process; see :func:`shared_reader`).

    For Milvus Lite it opens a private copy of the published folder, so any number of
    processes can read while ``sts kb build`` publishes a new one;
    :meth:`refresh_if_rebuilt` switches to a newer build.

    Raises:
        KnowledgeBaseError: No knowledge base or no collection at the configured place.
    """

    def __init__(self, kb: KnowledgeBaseConfig) -> None:
        self.kb = kb
        self.generation: tuple[int, int] | None = None
        self._copy: Path | None = None
        self._client: Any = None
        self.dim = 0
        self._open()

    def _open(self) -> None:
        if is_server_uri(self.kb.uri):
            self._client = _client(self.kb.uri, self.kb.token)
        else:
            path = _check_lite_path(self.kb.uri)
            for attempt in range(20):  # a rebuild renames the old folder away for a moment
                try:
                    generation = _generation(path)
                    break
                except FileNotFoundError:
                    if attempt == 19:
                        raise KnowledgeBaseError(
                            f"no knowledge base at {path}: run `sts kb build`") from None
                    time.sleep(0.05)
            _remove_stale_snapshots()
            tag = hashlib.sha1(str(path).encode()).hexdigest()[:10]
            copy = _SNAPSHOT_ROOT / f"{os.getpid()}-{tag}-{uuid.uuid4().hex[:8]}" / path.name
            shutil.copytree(path, copy, ignore=shutil.ignore_patterns("LOCK"))
            self._copy, self.generation = copy, generation
            self._client = _client(str(copy))
        if not self._client.has_collection(self.kb.collection):
            where = self.kb.uri
            self.close()
            raise KnowledgeBaseError(f"no collection {self.kb.collection!r} at {where}: "
                                     "run `sts kb build`")
        fields = self._client.describe_collection(self.kb.collection)["fields"]
        self.dim = next(int(f["params"]["dim"]) for f in fields if f["name"] == "vector")
        self._client.load_collection(self.kb.collection)

    def refresh_if_rebuilt(self) -> bool:
        """Reopen when a newer Milvus Lite build was published; ``True`` if it did."""
        if self.generation is None:
            return False
        try:
            if _generation(_check_lite_path(self.kb.uri)) == self.generation:
                return False
        except FileNotFoundError:  # mid-publish: keep the copy we have
            return False
        self.close()
        self._open()
        return True

    def search(self, vectors: "np.ndarray | Sequence[Sequence[float]]", top_k: int
               ) -> list[list[dict[str, Any]]]:
        """The ``top_k`` best articles per vector, best first (ties by ``id``): dicts with
        ``id``, ``score`` (cosine similarity), ``title``, ``text``, ``faq``, ``answer``.
        One Milvus call per :data:`MAX_NQ` vectors."""
        import numpy as np

        queries = np.asarray(vectors, dtype=np.float32)
        if queries.ndim != 2 or (len(queries) and queries.shape[1] != self.dim):
            raise KnowledgeBaseError(
                f"query vectors of shape {queries.shape} do not match the collection's "
                f"dimension {self.dim}: build the knowledge base with the same embedding model")
        out: list[list[dict[str, Any]]] = []
        for i in range(0, len(queries), MAX_NQ):
            result = self._client.search(self.kb.collection, data=queries[i:i + MAX_NQ].tolist(),
                                         limit=top_k, output_fields=list(HIT_FIELDS),
                                         search_params={"metric_type": "COSINE"})
            for hits in result:
                rows = [{"id": h["id"], "score": float(h["distance"]),
                         **{f: h["entity"].get(f) for f in HIT_FIELDS}} for h in hits]
                rows.sort(key=lambda r: (-round(r["score"], 6), r["id"]))
                out.append(rows)
        return out

    def count(self) -> int:
        """Articles in the collection."""
        return int(self._client.get_collection_stats(self.kb.collection)["row_count"])

    def close(self) -> None:
        """Close the client and delete the private copy. Idempotent."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._copy is not None:
            _release_lite(self._copy)
            shutil.rmtree(self._copy.parent, ignore_errors=True)
            self._copy = None


_READERS: dict[tuple[str, str, str], KnowledgeBaseReader] = {}
_READERS_LOCK = threading.Lock()


def shared_reader(kb: KnowledgeBaseConfig) -> KnowledgeBaseReader:
    """This process's reader of ``kb`` (opened once, refreshed after a rebuild)."""
    key = (kb.uri, kb.collection, kb.token)
    with _READERS_LOCK:
        reader = _READERS.get(key)
        if reader is None:
            reader = _READERS[key] = KnowledgeBaseReader(kb)
        else:
            reader.refresh_if_rebuilt()
        return reader


@atexit.register
def _close_readers() -> None:
    with _READERS_LOCK:
        for reader in _READERS.values():
            reader.close()
        _READERS.clear()


def search_text(question: str, kb: KnowledgeBaseConfig, embedding: EmbeddingConfig, *,
                top_k: int | None = None) -> list[dict[str, Any]]:
    """The best articles for one question (what ``sts kb search`` prints).

    Raises:
        InputFileError: ``question`` is empty.
        KnowledgeBaseError: No knowledge base or collection.
    """
    from spark_ext.l1.embedding import embed_texts

    if not question.strip():
        raise InputFileError("the question is empty")
    reader = KnowledgeBaseReader(kb)
    try:
        return reader.search(embed_texts([question], embedding), top_k or kb.top_k)[0]
    finally:
        reader.close()
