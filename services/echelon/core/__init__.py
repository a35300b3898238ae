"""Pure algorithms: plain data in, plain data out. No sockets, clocks or globals."""
