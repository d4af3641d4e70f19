def bounds_source():
    return ""


def describe_lemmas():
    return ""
