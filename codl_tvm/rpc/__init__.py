"""Remote devices through TVM's RPC tracker: the client, device farms, the server a board runs,
and deploying a model to a device behind a tracker.
"""
