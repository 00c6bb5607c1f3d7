"""JSON Schemas of what cvs writes (results.json), shipped as package data."""
