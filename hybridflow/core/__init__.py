"""The data model and the leaves every layer stands on: `Batch`, node kinds, config
constraints, deadlines on user calls, the one `"module:Name"` resolver and the one
user-file importer, prompt data, the worker context, the section reader and the `runtime`
section's schema.

Imports nothing of hybridflow outside `core/`.
"""
