"""The node agent's socket contract: requests, replies, error kinds, and its one client."""
