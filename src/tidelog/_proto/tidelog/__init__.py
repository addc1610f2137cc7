"""Generated protobuf/gRPC code. Do not edit: change proto/ and run `make proto`."""
