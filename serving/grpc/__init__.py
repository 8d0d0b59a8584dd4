"""The gRPC transport: our HTTP/2 connection (the default) or grpcio's server, the v2
GRPCInferenceService on either, and its protobuf codec."""
