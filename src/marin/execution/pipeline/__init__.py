"""The pipeline layer: handles and lowering, specs, canonical form, context, graph, resources,
targets, isolation.
"""
