"""The HTTP server: SGLang-native endpoints (`native.router`) over an `AsyncEngine`."""
