"""The node agent (`bootseer agent`): one long-running root service per node."""
