"""Generated from protos/echelon/v1 by `make proto`; do not edit."""
