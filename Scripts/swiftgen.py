#!/usr/bin/env python3
"""Writes Swift value types for the messages of a protoc descriptor set, with their bridge to the
C structs that protoc-c generates (see Scripts/generate-protos). Usage: swiftgen.py DESCRIPTOR_SET OUT.swift FILE.proto...

Naming follows protoc-c's rules so the Swift side can call the generated C functions:
  C type      Pkg__Part__Message__Nested     (package parts and message path, capitalised, joined by __)
  C functions pkg__part__message__nested__pack (lower_snake of each part)
Enums and oneof cases are read through their raw values, so no C constant names are guessed.
"""
import re
import sys

from google.protobuf import descriptor_pb2

F = descriptor_pb2.FieldDescriptorProto

# google.protobuf wrapper messages map to Swift optionals.
WRAPPERS = {
    ".google.protobuf.BoolValue": ("Bool", "bool"),
    ".google.protobuf.StringValue": ("String", "string"),
    ".google.protobuf.Int32Value": ("Int32", "int32"),
    ".google.protobuf.UInt32Value": ("UInt32", "uint32"),
    ".google.protobuf.Int64Value": ("Int64", "int64"),
    ".google.protobuf.UInt64Value": ("UInt64", "uint64"),
}
WRAPPER_C = {
    ".google.protobuf.BoolValue": ("Google__Protobuf__BoolValue", "google__protobuf__bool_value"),
    ".google.protobuf.StringValue": ("Google__Protobuf__StringValue", "google__protobuf__string_value"),
    ".google.protobuf.Int32Value": ("Google__Protobuf__Int32Value", "google__protobuf__int32_value"),
    ".google.protobuf.UInt32Value": ("Google__Protobuf__UInt32Value", "google__protobuf__uint32_value"),
    ".google.protobuf.Int64Value": ("Google__Protobuf__Int64Value", "google__protobuf__int64_value"),
    ".google.protobuf.UInt64Value": ("Google__Protobuf__UInt64Value", "google__protobuf__uint64_value"),
}

SCALARS = {
    F.TYPE_BOOL: "Bool", F.TYPE_STRING: "String", F.TYPE_BYTES: "[UInt8]",
    F.TYPE_INT32: "Int32", F.TYPE_SINT32: "Int32", F.TYPE_SFIXED32: "Int32",
    F.TYPE_INT64: "Int64", F.TYPE_SINT64: "Int64", F.TYPE_SFIXED64: "Int64",
    F.TYPE_UINT32: "UInt32", F.TYPE_FIXED32: "UInt32",
    F.TYPE_UINT64: "UInt64", F.TYPE_FIXED64: "UInt64",
    F.TYPE_DOUBLE: "Double", F.TYPE_FLOAT: "Float",
}
DEFAULTS = {"Bool": "false", "String": '""', "[UInt8]": "[]", "Double": "0", "Float": "0"}

# Swift type name prefixes per proto package, so that packages with the same message names
# (presence.v1.JoinRequest and presence.cluster.v1.JoinRequest) do not collide in one module.
PACKAGE_PREFIX = {"presence.cluster.v1": "Cluster", "presence.admin.v1": "Admin", "grpc.reflection.v1": "Reflection"}

# Files whose messages get canonical JSON coding (the WebSocket API of WEB.md).
JSON_FILES = {"presence.proto"}

SWIFT_KEYWORDS = {"default", "case", "class", "struct", "enum", "protocol", "func", "var", "let",
                  "in", "is", "as", "self", "Self", "type", "init", "return", "repeat", "where"}


def camel_to_lower(name):
    out = ""
    for i, ch in enumerate(name):
        if ch.isupper():
            if i > 0 and not name[i - 1].isupper():
                out += "_"
            out += ch.lower()
        else:
            out += ch
    return out


def lower_camel(snake):
    parts = snake.split("_")
    out = parts[0]
    for p in parts[1:]:
        if p == "id":
            out += "ID"
        elif p == "ids":
            out += "IDs"
        else:
            out += p[:1].upper() + p[1:]
    return out


def upper_camel(snake):
    s = lower_camel(snake)
    return s[:1].upper() + s[1:]


def swift_ident(name):
    return "`%s`" % name if name in SWIFT_KEYWORDS else name


class Gen:
    def __init__(self, fds, targets):
        self.out = []
        self.types = {}  # full proto name -> (swift name, c type, c func prefix, kind)
        self.files = [f for f in fds.file if f.name in targets]
        for f in fds.file:
            self.index(f)

    def index(self, f):
        pkg = f.package.split(".") if f.package else []
        c_pkg = "__".join(p[:1].upper() + p[1:] for p in pkg)
        fn_pkg = "__".join(camel_to_lower(p) for p in pkg)

        type_prefix = PACKAGE_PREFIX.get(f.package, "")

        def walk_msg(m, proto_prefix, swift_prefix, c_prefix, fn_prefix):
            full = proto_prefix + "." + m.name
            swift = (swift_prefix + "." if swift_prefix else type_prefix) + m.name
            c = (c_prefix + "__" if c_prefix else "") + m.name
            fn = (fn_prefix + "__" if fn_prefix else "") + camel_to_lower(m.name)
            self.types[full] = (swift, c, fn, "message", m)
            for n in m.nested_type:
                walk_msg(n, full, swift, c, fn)
            for e in m.enum_type:
                self.types[full + "." + e.name] = (swift + "." + e.name, c + "__" + e.name, None, "enum", e)

        root = "." + f.package if f.package else ""
        for m in f.message_type:
            walk_msg(m, root, "", c_pkg, fn_pkg)
        for e in f.enum_type:
            self.types[root + "." + e.name] = (type_prefix + e.name, (c_pkg + "__" if c_pkg else "") + e.name, None, "enum", e)

    def w(self, line=""):
        self.out.append(line)

    def run(self):
        self.w("// Generated by Scripts/swiftgen.py from " + ", ".join(f.name for f in self.files) + ". DO NOT EDIT.")
        self.w("// Regenerate with Scripts/generate-protos; a test fails when this file is stale.")
        self.w("import CPresenceProto")
        self.w()
        for f in self.files:
            root = "." + f.package if f.package else ""
            for e in f.enum_type:
                self.enum(root + "." + e.name, "")
            for m in f.message_type:
                self.message(root + "." + m.name, "")
            for s in f.service:
                self.service(f, s)
            if f.name in JSON_FILES:
                self.json_file(f)
        return "\n".join(self.out) + "\n"

    # ---- enums -------------------------------------------------------------------------------
    def enum(self, full, indent):
        swift, _, _, _, e = self.types[full]
        name = swift.split(".")[-1]
        prefix = camel_to_lower(e.name).upper() + "_"
        cases = []
        for v in e.value:
            vn = v.name[len(prefix):] if v.name.startswith(prefix) else v.name
            cases.append((swift_ident(lower_camel(vn.lower())), v.number))
        w = lambda s="": self.w(indent + s)
        w("/// `%s` (proto enum); `unrecognized` keeps a value this build does not know." % full[1:])
        w("public enum %s: Sendable, Hashable, CaseIterable {" % name)
        for c, n in cases:
            w("    case %s // = %d" % (c, n))
        w("    case unrecognized(Int32)")
        w()
        w("    public static var allCases: [%s] { [%s] }" % (name, ", ".join("." + c for c, _ in cases)))
        w()
        w("    public init(rawValue: Int32) {")
        w("        switch rawValue {")
        for c, n in cases:
            w("        case %d: self = .%s" % (n, c))
        w("        default: self = .unrecognized(rawValue)")
        w("        }")
        w("    }")
        w()
        w("    public var rawValue: Int32 {")
        w("        switch self {")
        for c, n in cases:
            w("        case .%s: return %d" % (c, n))
        w("        case .unrecognized(let value): return value")
        w("        }")
        w("    }")
        w("}")
        w()

    # ---- messages ----------------------------------------------------------------------------
    def field_swift_type(self, fd):
        if fd.type in SCALARS:
            base = SCALARS[fd.type]
        elif fd.type == F.TYPE_ENUM:
            base = self.types[fd.type_name][0]
        elif fd.type == F.TYPE_MESSAGE:
            if fd.type_name in WRAPPERS and fd.label != F.LABEL_REPEATED:
                return WRAPPERS[fd.type_name][0] + "?"
            base = self.types[fd.type_name][0]
        else:
            raise SystemExit("unsupported field type in " + fd.name)
        if fd.label == F.LABEL_REPEATED:
            return "[" + base + "]"
        if fd.type == F.TYPE_MESSAGE:
            return base + "?"
        return base

    def default_of(self, fd, st):
        if st.endswith("?"):
            return "nil"
        if st.startswith("["):
            return "[]"
        if fd.type == F.TYPE_ENUM:
            return "%s(rawValue: 0)" % st
        return DEFAULTS.get(st, "0")

    def message(self, full, indent):
        swift, ctype, fn, _, m = self.types[full]
        name = swift.split(".")[-1]
        w = lambda s="": self.w(indent + s)
        oneofs = {}
        plain = []
        for fd in m.field:
            if fd.HasField("oneof_index") and not fd.proto3_optional:
                oneofs.setdefault(fd.oneof_index, []).append(fd)
            else:
                plain.append(fd)
        w("/// `%s` (proto message)." % full[1:])
        w("public struct %s: ProtoMessage, Sendable, Hashable {" % name)
        for fd in plain:
            st = self.field_swift_type(fd)
            w("    public var %s: %s = %s" % (swift_ident(lower_camel(fd.name)), st, self.default_of(fd, st)))
        for idx, fds in oneofs.items():
            oname = m.oneof_decl[idx].name
            w("    public var %s: %s? = nil" % (swift_ident(lower_camel(oname)), upper_camel(oname)))
        w()
        for idx, fds in oneofs.items():
            oname = m.oneof_decl[idx].name
            w("    public enum %s: Sendable, Hashable {" % upper_camel(oname))
            for fd in fds:
                st = self.field_swift_type(fd).rstrip("?")
                w("        case %s(%s)" % (swift_ident(lower_camel(fd.name)), st))
            w("    }")
            w()
        # memberwise initializer with defaults
        params = []
        for fd in plain:
            st = self.field_swift_type(fd)
            params.append("%s: %s = %s" % (lower_camel(fd.name), st, self.default_of(fd, st)))
        for idx in oneofs:
            oname = m.oneof_decl[idx].name
            params.append("%s: %s? = nil" % (lower_camel(oname), upper_camel(oname)))
        if params:
            w("    public init() {}")
            w()
        w("    public init(%s) {" % ", ".join(params))
        for fd in plain:
            n = lower_camel(fd.name)
            w("        self.%s = %s" % (swift_ident(n), swift_ident(n) if n in SWIFT_KEYWORDS else n))
        for idx in oneofs:
            n = lower_camel(m.oneof_decl[idx].name)
            w("        self.%s = %s" % (swift_ident(n), n))
        w("    }")
        w()
        w("    /// Decodes protobuf bytes; throws `WireError` on malformed input.")
        w("    public init(serializedBytes bytes: UnsafeRawBufferPointer) throws {")
        w("        self = try WireCodec.decode(%s.self, from: bytes)" % swift)
        w("    }")
        w()
        w("    /// Encodes to protobuf bytes, after `prefix` bytes of zeros left for a frame header.")
        w("    public func serializedBytes(prefix: Int) -> [UInt8] {")
        w("        WireCodec.encode(self, prefix: prefix)")
        w("    }")
        for n in m.enum_type:
            w()
            self.enum(full + "." + n.name, indent + "    ")
        for n in m.nested_type:
            w()
            self.message(full + "." + n.name, indent + "    ")
        w("}")
        w()
        # bridge
        w("extension %s: CMessageBridge {" % swift)
        w("    typealias CStruct = %s" % ctype)
        w("    static func cUnpack(_ allocator: UnsafeMutablePointer<ProtobufCAllocator>, _ count: Int, _ data: UnsafePointer<UInt8>) -> UnsafeMutablePointer<CStruct>? { %s__unpack(allocator, count, data) }" % fn)
        w("    static func cPackedSize(_ message: UnsafePointer<CStruct>) -> Int { %s__get_packed_size(message) }" % fn)
        w("    static func cPack(_ message: UnsafePointer<CStruct>, _ out: UnsafeMutablePointer<UInt8>) -> Int { %s__pack(message, out) }" % fn)
        w()
        w("    init(cStruct c: UnsafePointer<CStruct>) throws {")
        w("        self.init()")
        for fd in plain:
            self.read_field(fd, "self." + swift_ident(lower_camel(fd.name)), "c.pointee." + fd.name, w)
        for idx, fds in oneofs.items():
            oname = m.oneof_decl[idx].name
            w("        switch Int(c.pointee.%s_case.rawValue) {" % oname)
            for fd in fds:
                w("        case %d:" % fd.number)
                tmp = "value"
                st = self.field_swift_type(fd).rstrip("?")
                w("            var %s: %s = %s" % (tmp, st, "try %s(cStruct: c.pointee.%s)" % (st, fd.name) if fd.type == F.TYPE_MESSAGE else self.default_of(fd, st)))
                if fd.type != F.TYPE_MESSAGE:
                    self.read_field(fd, tmp, "c.pointee." + fd.name, lambda s: w("    " + s))
                w("            self.%s = .%s(%s)" % (swift_ident(lower_camel(oname)), swift_ident(lower_camel(fd.name)), tmp))
            w("        default: break")
            w("        }")
        w("    }")
        w()
        w("    func fill(_ c: UnsafeMutablePointer<CStruct>, arena: inout CArena) {")
        w("        %s__init(c)" % fn)
        for fd in plain:
            self.write_field(fd, "self." + swift_ident(lower_camel(fd.name)), "c.pointee." + fd.name, w)
        for idx, fds in oneofs.items():
            oname = m.oneof_decl[idx].name
            w("        switch self.%s {" % swift_ident(lower_camel(oname)))
            w("        case nil: break")
            for fd in fds:
                w("        case .%s(let value)?:" % swift_ident(lower_camel(fd.name)))
                w("            c.pointee.%s_case = .init(rawValue: %d)" % (oname, fd.number))
                self.write_field(fd, "value", "c.pointee." + fd.name, lambda s: w("    " + s), in_oneof=True)
            w("        }")
        w("    }")
        w("}")
        w()

    def read_field(self, fd, dst, src, w):
        rep = fd.label == F.LABEL_REPEATED
        cnt = src.rsplit(".", 1)[0] + ".n_" + fd.name
        if fd.type == F.TYPE_MESSAGE and fd.type_name in WRAPPERS and not rep:
            w("        if let wrapped = %s { %s = %s }" % (src, dst, self.scalar_read(WRAPPERS[fd.type_name][1], "wrapped.pointee.value")))
            return
        if rep:
            if fd.type == F.TYPE_MESSAGE:
                st = self.types[fd.type_name][0]
                w("        %s = try WireCodec.readArray(%s, %s) { try %s(cStruct: $0!) }" % (dst, src, cnt, st))
            else:
                w("        %s = try WireCodec.readArray(%s, %s) { %s }" % (dst, src, cnt, self.scalar_read_fd(fd, "$0")))
            return
        if fd.type == F.TYPE_MESSAGE:
            st = self.types[fd.type_name][0]
            w("        if let sub = %s { %s = try %s(cStruct: sub) }" % (src, dst, st))
            return
        w("        %s = %s" % (dst, self.scalar_read_fd(fd, src)))

    def scalar_read_fd(self, fd, src):
        if fd.type == F.TYPE_ENUM:
            return "%s(rawValue: Int32(truncatingIfNeeded: %s.rawValue))" % (self.types[fd.type_name][0], src)
        return self.scalar_read({F.TYPE_STRING: "string", F.TYPE_BYTES: "bytes", F.TYPE_BOOL: "bool"}.get(fd.type, "number"), src)

    def scalar_read(self, kind, src):
        if kind == "string":
            return "try WireCodec.readString(%s)" % src
        if kind == "bytes":
            return "WireCodec.readBytes(%s)" % src
        if kind == "bool":
            return "%s != 0" % src
        return src

    def write_field(self, fd, src, dst, w, in_oneof=False):
        rep = fd.label == F.LABEL_REPEATED
        cnt = dst.rsplit(".", 1)[0] + ".n_" + fd.name
        if fd.type == F.TYPE_MESSAGE and fd.type_name in WRAPPERS and not rep:
            cname, cfn = WRAPPER_C[fd.type_name]
            kind = WRAPPERS[fd.type_name][1]
            w("        if let value = %s {" % src)
            w("            let wrapped = arena.allocate(%s.self)" % cname)
            w("            %s__init(wrapped)" % cfn)
            w("            wrapped.pointee.value = %s" % self.scalar_write(kind, "value"))
            w("            %s = wrapped" % dst)
            w("        }")
            return
        if rep:
            if fd.type == F.TYPE_MESSAGE:
                st = self.types[fd.type_name][0]
                w("        (%s, %s) = arena.messageArray(%s)" % (cnt, dst, src))
            elif fd.type == F.TYPE_STRING:
                w("        (%s, %s) = arena.stringArray(%s)" % (cnt, dst, src))
            elif fd.type in (F.TYPE_UINT32, F.TYPE_UINT64, F.TYPE_INT32, F.TYPE_INT64):
                w("        (%s, %s) = arena.scalarArray(%s)" % (cnt, dst, src))
            elif fd.type == F.TYPE_BYTES:
                w("        (%s, %s) = arena.binaryArray(%s)" % (cnt, dst, src))
            else:
                raise SystemExit("repeated scalars of this type are not supported: " + fd.name)
            return
        if fd.type == F.TYPE_MESSAGE:
            if in_oneof:
                w("        %s = arena.message(%s)" % (dst, src))
            else:
                w("        if let sub = %s { %s = arena.message(sub) }" % (src, dst))
            return
        if fd.type == F.TYPE_ENUM:
            w("        %s = .init(rawValue: .init(truncatingIfNeeded: %s.rawValue))" % (dst, src))
            return
        kind = {F.TYPE_STRING: "string", F.TYPE_BYTES: "bytes", F.TYPE_BOOL: "bool"}.get(fd.type, "number")
        if kind == "string":
            w("        if !%s.isEmpty { %s = arena.cString(%s) }" % (src, dst, src))
        else:
            w("        %s = %s" % (dst, self.scalar_write(kind, src)))

    def scalar_write(self, kind, src):
        if kind == "string":
            return "arena.cString(%s)" % src
        if kind == "bytes":
            return "arena.binary(%s)" % src
        if kind == "bool":
            return "%s ? 1 : 0" % src
        return src

    # ---- canonical JSON (the WebSocket API, WEB.md) --------------------------------------------
    def json_enum(self, full):
        swift, _, _, _, e = self.types[full]
        self.w("extension %s {" % swift)
        self.w("    /// The JSON names of the values (protobuf's canonical JSON mapping), by number.")
        self.w("    public static let jsonNames: [String: Int32] = [%s]" % ", ".join('"%s": %d' % (v.name, v.number) for v in e.value))
        self.w("    /// This value's JSON name (its number, for one this build does not know).")
        self.w("    public var json: JSONValue {")
        self.w("        switch rawValue {")
        for v in e.value:
            self.w('        case %d: return .string("%s")' % (v.number, v.name))
        self.w("        default: return .number(String(rawValue))")
        self.w("        }")
        self.w("    }")
        self.w("}")
        self.w()

    def json_read(self, fd, v, path):
        """Swift expression reading one (non-repeated) value `v` of field `fd`."""
        if fd.type == F.TYPE_MESSAGE:
            if fd.type_name in WRAPPERS:
                kind = WRAPPERS[fd.type_name][1]
                inner = {"bool": "JSONField.bool(%s, %s)", "string": "JSONField.string(%s, %s)"}.get(kind, "JSONField.integer(%s, %s)")
                return "(%s == .null ? nil : try %s)" % (v, inner % (v, path))
            return "try %s(json: %s)" % (self.types[fd.type_name][0], v)
        if fd.type == F.TYPE_ENUM:
            st = self.types[fd.type_name][0]
            return "%s(rawValue: try JSONField.enumValue(%s, %s, names: %s.jsonNames))" % (st, v, path, st)
        if fd.type == F.TYPE_STRING:
            return "try JSONField.string(%s, %s)" % (v, path)
        if fd.type == F.TYPE_BOOL:
            return "try JSONField.bool(%s, %s)" % (v, path)
        if fd.type == F.TYPE_BYTES:
            return "try JSONField.bytes(%s, %s)" % (v, path)
        if fd.type in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
            return "%s(try JSONField.double(%s, %s))" % (SCALARS[fd.type], v, path)
        return "try JSONField.integer(%s, %s, as: %s.self)" % (v, path, SCALARS[fd.type])

    def json_write(self, fd, v):
        """Swift expression writing one (non-repeated) value `v` of field `fd`."""
        if fd.type == F.TYPE_MESSAGE:
            if fd.type_name in WRAPPERS:
                kind = WRAPPERS[fd.type_name][1]
                return {"bool": ".bool(%s)", "string": ".string(%s)"}.get(kind, "JSONField.integerValue(%s)") % v
            return "%s.json()" % v
        if fd.type == F.TYPE_ENUM:
            return "%s.json" % v
        if fd.type == F.TYPE_STRING:
            return ".string(%s)" % v
        if fd.type == F.TYPE_BOOL:
            return ".bool(%s)" % v
        if fd.type == F.TYPE_BYTES:
            return ".string(Base64.encode(%s))" % v
        if fd.type in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
            return "JSONField.doubleValue(Double(%s))" % v
        return "JSONField.integerValue(%s)" % v

    def json_is_default(self, fd, v):
        st = self.field_swift_type(fd)
        if fd.label == F.LABEL_REPEATED:
            return "%s.isEmpty" % v
        if st.endswith("?"):
            return "%s == nil" % v
        if fd.type == F.TYPE_ENUM:
            return "%s.rawValue == 0" % v
        if fd.type in (F.TYPE_STRING, F.TYPE_BYTES):
            return "%s.isEmpty" % v
        if fd.type == F.TYPE_BOOL:
            return "!%s" % v
        return "%s == 0" % v

    def json_message(self, full):
        swift, _, _, _, m = self.types[full]
        for n in m.enum_type:
            self.json_enum(full + "." + n.name)
        for n in m.nested_type:
            self.json_message(full + "." + n.name)
        w = self.w
        oneofs = {}
        plain = []
        for fd in m.field:
            if fd.HasField("oneof_index") and not fd.proto3_optional:
                oneofs.setdefault(fd.oneof_index, []).append(fd)
            else:
                plain.append(fd)
        w("extension %s: JSONCodable {" % swift)
        w("    /// Reads the canonical JSON form (field names as lowerCamelCase or as in the .proto;")
        w("    /// unknown fields are ignored; null is the default).")
        w("    public init(json: JSONValue) throws(JSONError) {")
        w("        self.init()")
        w("        guard case .object(let members) = json else { throw JSONError(\"%s: an object expected\") }" % m.name)
        if m.field:
            w("        for (key, value) in members {")
            w("            switch key {")
            for fd in plain:
                name = "self." + swift_ident(lower_camel(fd.name))
                path = '"%s.%s"' % (m.name, fd.json_name)
                labels = '"%s"' % fd.json_name + (', "%s"' % fd.name if fd.name != fd.json_name else "")
                if fd.label == F.LABEL_REPEATED:
                    w("            case %s: %s = try JSONField.array(value, %s).map { (v) throws(JSONError) in %s }" % (labels, name, path, self.json_read(fd, "v", path)))
                else:
                    w("            case %s: %s = %s" % (labels, name, self.json_read(fd, "value", path)))
            for idx, fds in oneofs.items():
                oname = m.oneof_decl[idx].name
                for fd in fds:
                    path = '"%s.%s"' % (m.name, fd.json_name)
                    labels = '"%s"' % fd.json_name + (', "%s"' % fd.name if fd.name != fd.json_name else "")
                    w("            case %s: if value != .null { self.%s = .%s(%s) }" % (labels, swift_ident(lower_camel(oname)), swift_ident(lower_camel(fd.name)), self.json_read(fd, "value", path)))
            w("            default: break")
            w("            }")
            w("        }")
        else:
            w("        _ = members")
        w("    }")
        w()
        w("    /// The canonical JSON form (fields at their default are left out).")
        w("    public func json() -> JSONValue {")
        if not m.field:
            w("        .object([])")
        else:
            w("        var members: [(String, JSONValue)] = []")
            for fd in plain:
                name = "self." + swift_ident(lower_camel(fd.name))
                if fd.label == F.LABEL_REPEATED:
                    w('        if !%s.isEmpty { members.append(("%s", .array(%s.map { %s }))) }' % (name, fd.json_name, name, self.json_write(fd, "$0")))
                elif self.field_swift_type(fd).endswith("?"):
                    w('        if let v = %s { members.append(("%s", %s)) }' % (name, fd.json_name, self.json_write(fd, "v")))
                else:
                    w('        if !(%s) { members.append(("%s", %s)) }' % (self.json_is_default(fd, name), fd.json_name, self.json_write(fd, name)))
            for idx, fds in oneofs.items():
                oname = m.oneof_decl[idx].name
                w("        switch self.%s {" % swift_ident(lower_camel(oname)))
                w("        case nil: break")
                for fd in fds:
                    w('        case .%s(let v)?: members.append(("%s", %s))' % (swift_ident(lower_camel(fd.name)), fd.json_name, self.json_write(fd, "v")))
                w("        }")
            w("        return .object(members)")
        w("    }")
        w("}")
        w()

    def json_file(self, f):
        root = "." + f.package if f.package else ""
        self.w("// MARK: - Canonical JSON (the WebSocket API)")
        self.w()
        for e in f.enum_type:
            self.json_enum(root + "." + e.name)
        for m in f.message_type:
            self.json_message(root + "." + m.name)

    # ---- services ----------------------------------------------------------------------------
    def service(self, f, s):
        full = (f.package + "." if f.package else "") + s.name
        self.w("/// The methods of gRPC service `%s`." % full)
        self.w("public enum %sMethods {" % s.name)
        self.w("    public static let serviceName = \"%s\"" % full)
        for m in s.method:
            if m.client_streaming and not m.server_streaming:
                raise SystemExit("client streaming alone is not supported: " + m.name)
            kind = ".bidiStreaming" if m.client_streaming else ".serverStreaming" if m.server_streaming else ".unary"
            req = self.types[m.input_type][0]
            resp = self.types[m.output_type][0]
            self.w("    public static let %s = MethodDescriptor<%s, %s>(path: \"/%s/%s\", kind: %s)"
                   % (m.name[:1].lower() + m.name[1:], req, resp, full, m.name, kind))
        self.w("    public static let allPaths: [String] = [%s]" % ", ".join(
            "\"/%s/%s\"" % (full, m.name) for m in s.method))
        self.w("}")
        self.w()


def main():
    fds = descriptor_pb2.FileDescriptorSet()
    with open(sys.argv[1], "rb") as fh:
        fds.ParseFromString(fh.read())
    text = Gen(fds, set(sys.argv[3:])).run()
    with open(sys.argv[2], "w") as fh:
        fh.write(text)


if __name__ == "__main__":
    main()
