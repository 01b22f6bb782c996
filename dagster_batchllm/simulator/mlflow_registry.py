"""A real local MLflow registry (SQLite backend, artifacts in a folder) for tests and benchmarks.

Example::

    registry = LocalRegistry("/tmp/reg")
    version = registry.log_sklearn("risk", fitted_model, input_example=X.head(3),
                                   alias="champion")
    # models:/risk@champion now resolves to that version, at registry.uri
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any


class LocalRegistry:
    """An MLflow tracking server's store and model registry in ``root`` (no server)."""

    def __init__(self, root: str | os.PathLike, experiment: str = "batchllm"):
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # nothing leaves the machine
        import mlflow
        from mlflow import MlflowClient

        from ..core import ready_registry

        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.uri = f"sqlite:///{self.root / 'mlflow.db'}"
        ready_registry(self.uri)  # other processes may be opening it too
        self.client = MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)
        found = self.client.get_experiment_by_name(experiment)
        self.experiment_id = found.experiment_id if found else self.client.create_experiment(
            experiment, artifact_location=(self.root / "artifacts").as_uri())
        self._mlflow = mlflow

    @contextlib.contextmanager
    def _logging(self):
        """A run of this registry, MLflow's process-wide URIs put back afterwards."""
        from ..core import mlflow_uris

        with mlflow_uris(self.uri), self._mlflow.start_run(
                experiment_id=self.experiment_id) as run:
            yield run

    def log_sklearn(self, name: str, model: Any, *, input_example: Any,
                    alias: str | None = None,
                    serialization_format: str | None = "cloudpickle") -> str:
        """Log a fitted scikit-learn model, register it as a new version of ``name``; the
        version (and ``alias`` moved to it). ``serialization_format``: None for MLflow's
        default (skops in MLflow 3)."""
        import mlflow.sklearn

        formats = {} if serialization_format is None else \
            {"serialization_format": serialization_format}
        with self._logging() as run:
            info = mlflow.sklearn.log_model(model, name="model", input_example=input_example,
                                            **formats)
        return self._register(name, info.model_uri, run.info.run_id, alias)

    def log_pyfunc(self, name: str, python_model: Any, *, input_example: Any = None,
                   alias: str | None = None, model_config: dict[str, Any] | None = None,
                   signature: Any = None) -> str:
        import mlflow.pyfunc

        with self._logging() as run:
            info = mlflow.pyfunc.log_model(name="model", python_model=python_model,
                                           input_example=input_example,
                                           model_config=model_config, signature=signature)
        return self._register(name, info.model_uri, run.info.run_id, alias)

    def _register(self, name: str, model_uri: str, run_id: str, alias: str | None) -> str:
        from ..core import mlflow_uris

        if not self.client.search_registered_models(filter_string=f"name = '{name}'"):
            self.client.create_registered_model(name)
        with mlflow_uris(self.uri):  # a logged model's source is looked up where it was logged
            version = self.client.create_model_version(name, model_uri, run_id=run_id).version
        if alias:
            self.client.set_registered_model_alias(name, alias, version)
        return str(version)

    def set_alias(self, name: str, alias: str, version: str) -> None:
        self.client.set_registered_model_alias(name, alias, version)

    def run_uri(self, name: str, version: str) -> str:
        """The ``runs:/`` URI of a version's model."""
        return f"runs:/{self.client.get_model_version(name, version).run_id}/model"

    def local_path(self, name: str, version: str, dest: str | os.PathLike) -> str:
        """A version's model downloaded into ``dest`` (a plain folder with its MLmodel)."""
        from ..core import mlflow_uris

        with mlflow_uris(self.uri):
            return self._mlflow.artifacts.download_artifacts(
                artifact_uri=f"models:/{name}/{version}", dst_path=str(dest))


# -- models the tests and benchmarks share ------------------------------------------------------
FEATURES = ["f1", "f2"]


def feature_frame(rows: int, seed: int = 0) -> Any:
    """Two numeric features, the shape of the ``risk`` models below."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    return pd.DataFrame({"f1": rng.normal(size=rows), "f2": rng.normal(size=rows)})


def fit_risk_model(version: int) -> Any:
    """A logistic regression over ``f1, f2``; versions 1 and 2 draw their boundary differently
    (so a moved alias changes predictions)."""
    from sklearn.linear_model import LogisticRegression

    frame = feature_frame(400, seed=version)
    labels = ((frame.f1 + frame.f2 > 0) if version == 1 else (frame.f1 - frame.f2 > 0.5))
    return LogisticRegression().fit(frame, labels.astype(int))


def two_risk_versions(folder: Any, name: str = "risk") -> LocalRegistry:
    """A registry of its own under ``folder`` holding ``name`` v1 (alias ``champion``) and v2
    (no alias): for tests that move the alias, which a shared registry must keep."""
    registry = LocalRegistry(folder)
    example = feature_frame(3)
    registry.log_sklearn(name, fit_risk_model(1), input_example=example, alias="champion")
    registry.log_sklearn(name, fit_risk_model(2), input_example=example)
    return registry


def fit_intent_model(texts: list[str], labels: list[str]) -> Any:
    """TF-IDF + logistic regression over a ``text`` column (a DataFrame in, labels out)."""
    import pandas as pd
    from sklearn.compose import ColumnTransformer
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline

    model = Pipeline([
        ("tfidf", ColumnTransformer([("text", TfidfVectorizer(ngram_range=(1, 2)), "text")])),
        ("classify", LogisticRegression(max_iter=1000)),
    ])
    return model.fit(pd.DataFrame({"text": texts}), labels)


class ModelServer:
    """``mlflow models serve`` of one model on 127.0.0.1 (MLflow's scoring protocol at
    ``base_url + /invocations``), as a context manager. ``--env-manager local``: it runs this
    interpreter's environment, whose ``bin`` goes first on PATH (MLflow starts ``uvicorn``).
    ``port``: a given one (a redeploy under the same URL); else a free one."""

    def __init__(self, model_uri: str, *, tracking_uri: str | None = None,
                 workers: int = 1, startup_timeout_s: float = 90.0, port: int | None = None):
        self.model_uri = model_uri
        self.tracking_uri = tracking_uri
        self.workers = workers
        self.startup_timeout_s = startup_timeout_s
        self.port = port or _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._proc: Any = None

    def __enter__(self) -> ModelServer:
        import subprocess
        import sys
        import urllib.request

        from .clients import wait_until

        bin_dir = os.path.dirname(sys.executable)
        env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
               "MLFLOW_DISABLE_TELEMETRY": "true"}
        if self.tracking_uri:
            env["MLFLOW_TRACKING_URI"] = env["MLFLOW_REGISTRY_URI"] = self.tracking_uri
        import tempfile

        # A file, not a pipe: uvicorn logs every request, and a full pipe would stall it.
        self._log = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            [os.path.join(bin_dir, "mlflow"), "models", "serve", "-m", self.model_uri,
             "-h", "127.0.0.1", "-p", str(self.port), "--env-manager", "local",
             "-w", str(self.workers)],
            env=env, stdout=subprocess.DEVNULL, stderr=self._log,
            start_new_session=True)  # its own group: uvicorn's workers stop with it

        def up() -> bool:
            if self._proc.poll() is not None:
                self._log.seek(0)
                raise RuntimeError(f"mlflow models serve exited: "
                                   f"{self._log.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(self.base_url + "/ping", timeout=1) as reply:
                    return reply.status == 200
            except OSError:
                return False

        try:
            wait_until(up, self.startup_timeout_s, f"mlflow models serve {self.model_uri}",
                       poll_s=0.2)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        import signal
        import subprocess

        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is not None:
            self._log.close()
            return
        os.killpg(proc.pid, signal.SIGTERM)  # the group this server's Popen started
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # The CLI can end before its uvicorn worker, which would go on answering on the port:
        # a server started next on the same port (a redeploy) would pass its /ping through
        # the old one. The group goes, and the port is closed, before stop() returns.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        _wait_port_closed(self.port, timeout_s=10.0)
        self._log.close()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _wait_port_closed(port: int, timeout_s: float) -> None:
    import socket
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            sock.settimeout(0.2)
            if sock.connect_ex(("127.0.0.1", port)) != 0:
                return
        time.sleep(0.05)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
