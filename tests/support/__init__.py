"""Helpers the tests share (plain functions and values; the fixtures are in ``tests/conftest.py``).

- :data:`REPO`: the repository's root, the one place a test finds the sample tree, the docs,
  ``bench/`` or the package from (test files move between tiers; their ``__file__`` does not
  say where the root is);

- :mod:`tests.support.tree`: tiny kernel trees written under ``tmp_path`` (layout tests);
- :mod:`tests.support.build`: a small tree, a recording fake ``nvcc``, config and cache for
  the build steps;
- :mod:`tests.support.project`: a five-target project and real ``doit`` runs over it;
- :mod:`tests.support.servers`: local S3/GCS servers and dead endpoints;
- :mod:`tests.support.trust`: black-box projects built by real ``doit``/``metrale-orch``
  runs, compiler wrappers, artefact comparison;
- :mod:`tests.support.reapi`: a real remote-execution engine (BuildGrid 0.4.4 on PostgreSQL)
  with test workers, and its pieces: ``reapi_deps`` (the BuildGrid venv, PostgreSQL),
  ``reapi_action`` (the probe's typed values); ``reapi_cas``, ``reapi_run``, ``reapi_worker``
  and ``reapi_probe`` run in the BuildGrid venv, never in the test process;
- one module per package area (``cache``, ``steps``, ``toolchain``, ...): what the unit and
  the scenario tests of that area share, and ``docs`` for the docs checks;
- :mod:`tests.support.spawn_guard`: the unit tier's guard (no process may start).
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository's root (the folder holding ``pyproject.toml``)."""
