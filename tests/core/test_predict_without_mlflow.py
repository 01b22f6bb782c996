"""The core keeps working without mlflow installed: infer() is untouched, and predict() says
what to install instead of failing on an import deep inside. Run in a subprocess where
``import mlflow`` fails, as on a machine without the extra."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import sys
    sys.modules["mlflow"] = None  # import mlflow now raises ImportError
    import pandas as pd
    from dagster_batchllm import BatchInferenceResource, MlflowModel
    from dagster_batchllm.core.errors import InferenceConfigError
    from dagster_batchllm.testing import SimulatedEndpoint

    with SimulatedEndpoint(models=("m",)) as sim:
        from dagster_batchllm import Endpoint
        llm = BatchInferenceResource(
            endpoints=[Endpoint(name="e", base_url=sim.base_url, models=["m"])],
            mlflow_models=[MlflowModel(name="risk", model_uri="models:/risk@champion")],
            store_url=None)
        df = pd.DataFrame({"text": ["hello"], "f1": [1.0]})
        print(llm.infer(df, prompt="Say: {text}", model="m").stats.summary())
        try:
            llm.predict(df, model="risk", input_columns=["f1"])
        except InferenceConfigError as exc:
            print("raised:", exc)
        llm.close()
""")


@pytest.mark.slow
def test_infer_works_and_predict_names_the_extra_without_mlflow(tmp_path):
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "1 rows: 1 ok" in done.stdout
    assert "raised: predict() with MLflow models needs mlflow: pip install " \
           "'dagster-batchllm[mlflow]'" in done.stdout
