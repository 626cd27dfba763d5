"""Generated REAPI v2, ByteStream and Bots API stubs: written by ``regen.py``, never edited.

Flat module names in this private package (``remote_execution_pb2``, ``bytestream_pb2``,
``bots_pb2`` ...): nothing is importable as a top-level ``build`` package and nothing
shadows ``google.*``, yet every ``.proto`` file and message keeps its upstream full name,
so an ``Any`` of ``type.googleapis.com/build.bazel.remote.execution.v2.ExecuteResponse``
unpacks. ``google.api``, ``google.rpc`` and ``google.longrunning`` are
googleapis-common-protos' own modules (the ``remote`` extra): protobuf's default pool
refuses a second, different registration of their files (``source/README.md``).
Importing these modules needs grpcio and protobuf; :mod:`metrale_orch.remote` is the
one door that turns their absence into a clear error.
"""
