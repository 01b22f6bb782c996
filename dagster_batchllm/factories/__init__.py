"""The Dagster layer: what turns a batchllm call into a software-defined asset.

* :mod:`.shared`: the one body every asset factory uses (the shared keywords, the spec, the
  run per partition, the checks), and :class:`~.shared.AssetJob`, what a job says for itself;
* :mod:`.inference`, :mod:`.embedding`, :mod:`.scoring`: the factories of the three jobs;
  :mod:`.calls`: the factory of any other registered job's call;
* :mod:`.partitions`, :mod:`.checks`, :mod:`.metadata`: a run's partitions, its checks, its
  figures; :mod:`.context`: what a Dagster context tells a call.

Nothing is imported here: :mod:`.context` is read by the SQL functions and the Spark driver,
which must not import Dagster for it. The public names are ``dagster_batchllm``'s.
"""
