"""The process model: the supervisor of several workers on one port (spawn, respawn, drain), the
statistics they share, and the URL a replica advertises."""
