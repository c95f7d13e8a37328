"""rlgw.sandboxes"""
