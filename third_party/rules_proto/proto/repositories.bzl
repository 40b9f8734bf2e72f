def rules_proto_dependencies():
    pass

def rules_proto_toolchains():
    pass
