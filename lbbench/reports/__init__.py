"""lbbench.reports"""
