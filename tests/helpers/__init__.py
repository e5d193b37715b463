"""Helpers shared by the test tiers (real vLLM engine fixture, ...)."""
