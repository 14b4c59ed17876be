"""placeholder"""
def programs():
    return []
