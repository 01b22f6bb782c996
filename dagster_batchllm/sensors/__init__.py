"""Sensors for inference assets.

* :func:`build_retry_partitions_sensor` re-materializes the partitions whose rows failed or were
  deferred (:mod:`.retry_partitions`);
* :func:`build_new_data_sensor` runs the partitions whose source rows are new (:mod:`.new_data`);
* :func:`build_batch_collect_sensor` runs the partitions whose provider batches ended, or whose
  deadline's switch time has come (:mod:`.batches`).
"""

from ..factories.deadlines import DEADLINE_TAG
from .batches import BATCH_COLLECT_TAG, build_batch_collect_sensor
from .common import NEW_DATA_CURSOR_TAG, NEW_DATA_TAG, RETRY_ROUND_TAG, RETRY_TAG
from .new_data import NewRowsSince, build_new_data_sensor
from .retry_partitions import build_retry_partitions_sensor

__all__ = [
    "BATCH_COLLECT_TAG",
    "DEADLINE_TAG",
    "NEW_DATA_CURSOR_TAG",
    "NEW_DATA_TAG",
    "RETRY_ROUND_TAG",
    "RETRY_TAG",
    "NewRowsSince",
    "build_batch_collect_sensor",
    "build_new_data_sensor",
    "build_retry_partitions_sensor",
]
