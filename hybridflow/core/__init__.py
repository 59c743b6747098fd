"""The data model and the leaves every layer stands on: `Batch`, node kinds, config
constraints, deadlines on user calls, the one `"module:Name"` resolver and the one
user-file importer, prompt data, the worker context and the section reader.

Imports nothing of hybridflow outside `core/`.
"""
