"""rlgw.sync"""
