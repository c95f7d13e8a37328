"""rlgw.scaffolds"""
