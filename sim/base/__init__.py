"""Foundations every layer shares: errors, value checks, documented limits, the record validator, the JSON writer, output paths, fitting helpers, units."""
