"""Remote execution over REAPI v2 (gRPC); the generated stubs live in :mod:`._proto`."""
