"""The MCP face: the server's handlers, input-required rounds and the shapes of results."""
