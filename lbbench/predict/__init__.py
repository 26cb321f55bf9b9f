"""lbbench.predict"""
