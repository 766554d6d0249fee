"""Helpers shared by the test suite: free ports, waiting for sockets, child processes."""
