"""The live layer: the asyncio drive loop shared by replay and proxy, and the streaming HTTP client."""
