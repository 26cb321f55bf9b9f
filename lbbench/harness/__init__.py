"""lbbench.harness"""
