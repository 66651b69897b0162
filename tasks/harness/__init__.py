"""Harness servers: the episode hub, the MCP server, the recording proxy and the HTTP guard."""
