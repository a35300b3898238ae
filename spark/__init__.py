"""The routing job."""
