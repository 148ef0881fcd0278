"""phalanx API contracts (protobuf/gRPC), by version."""
