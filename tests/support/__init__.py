"""Helpers the tests share (plain functions and values; the fixtures are in ``tests/conftest.py``).

- :mod:`tests.support.tree`: tiny kernel trees written under ``tmp_path`` (layout tests);
- :mod:`tests.support.build`: a small tree, a recording fake ``nvcc``, config and cache for
  the build steps;
- :mod:`tests.support.project`: a five-target project and real ``doit`` runs over it;
- :mod:`tests.support.servers`: local S3/GCS servers and dead endpoints;
- :mod:`tests.support.trust`: black-box projects built by real ``doit``/``metrale-orch``
  runs, compiler wrappers, artefact comparison.
"""
