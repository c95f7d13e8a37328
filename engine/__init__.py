"""rlgw.engine"""
