"""lbbench.workloads"""
