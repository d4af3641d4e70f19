def bounds_source():
    return ""
