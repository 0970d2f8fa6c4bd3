"""radixserve: an asyncio-native LLM inference engine."""
