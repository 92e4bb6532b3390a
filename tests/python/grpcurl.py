"""A stand-in for grpcurl covering what the README uses, working only through
the server's reflection service: no .proto files and no generated code.

    grpcurl.py -plaintext [-H 'NAME: VALUE']... HOST:PORT list [SERVICE]
    grpcurl.py -plaintext [-d JSON] [-H 'NAME: VALUE']... HOST:PORT SERVICE/METHOD

Unary and server-streaming calls. Responses print as grpcurl prints them: the
protobuf JSON mapping (camelCase names, default values left out), one object
per message. A failed call prints ERROR: with its code, message and details
to stderr, each detail decoded by its type URL through reflection, and exits
64 + the status code, as grpcurl does."""

import sys

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory

# google.rpc.Status itself is compiled in, as in grpcurl; the details it
# carries are resolved through reflection only.
from google.rpc import status_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

USAGE = __doc__.split("\n\n")[1]

# Go's names for the status codes, as grpcurl prints them.
CODE_NAMES = {
    code: "".join(word.capitalize() for word in code.name.split("_"))
    for code in grpc.StatusCode
}
CODE_NAMES[grpc.StatusCode.OK] = "OK"


def fail(problem):
    sys.stderr.write(f"Error: {problem}\n")
    return 1


def usage(problem):
    sys.stderr.write(f"grpcurl.py: {problem}\nusage:\n{USAGE}\n")
    sys.exit(2)


def parse_arguments(argv):
    plaintext, data, headers, rest = False, None, [], []
    arguments = iter(argv)
    for argument in arguments:
        if argument in ("-plaintext", "--plaintext"):
            plaintext = True
        elif argument in ("-d", "-H"):
            value = next(arguments, None)
            if value is None:
                usage(f"{argument} needs a value")
            if argument == "-d":
                data = value
            else:
                name, colon, header = value.partition(":")
                if not colon:
                    usage(f"-H {value!r}: expected 'NAME: VALUE'")
                headers.append((name.strip().lower(), header.strip()))
        elif argument.startswith("-"):
            usage(f"unsupported flag {argument}")
        else:
            rest.append(argument)
    if not plaintext:
        usage("only -plaintext connections are supported")
    if not rest:
        usage("no address given")
    return data, headers, rest[0], rest[1:]


def print_error(error, pool):
    """grpcurl's report of a failed call, each detail resolved by its type
    URL in the reflection pool (as grpcurl resolves them)."""
    sys.stderr.write(
        f"ERROR:\n  Code: {CODE_NAMES[error.code()]}\n  Message: {error.details()}\n"
    )
    status = dict(error.trailing_metadata() or ()).get("grpc-status-details-bin")
    details = status_pb2.Status.FromString(status).details if status else []
    if details:
        sys.stderr.write("  Details:\n")
    for number, detail in enumerate(details, 1):
        prefix = f"  {number})"
        try:
            text = json_format.MessageToJson(detail, indent=2, descriptor_pool=pool)
        except (TypeError, grpc.RpcError):  # not found, or reflection failed
            name = detail.type_url.rsplit("/", 1)[-1]
            sys.stderr.write(
                f"{prefix}\tError parsing detail message: {name} is not recognized\n"
            )
            continue
        indent = " " * len(prefix) + "\t"
        sys.stderr.write(f"{prefix}\t" + text.replace("\n", "\n" + indent) + "\n")


def main(argv):
    data, headers, address, command = parse_arguments(argv)
    channel = grpc.insecure_channel(address)
    database = ProtoReflectionDescriptorDatabase(channel)
    pool = descriptor_pool.DescriptorPool(database)

    if command[:1] == ["list"]:
        if len(command) > 2:
            usage("list takes at most one service")
        if len(command) == 1:
            names = database.get_services()
        else:
            try:
                service = pool.FindServiceByName(command[1])
            except (KeyError, grpc.RpcError):
                return fail(f"Failed to list methods for service {command[1]!r}: not found")
            names = [method.full_name for method in service.methods]
        for name in sorted(names):
            print(name)
        return 0

    if len(command) != 1:
        usage("expected list [SERVICE] or one SERVICE/METHOD")
    service_name, slash, method_name = command[0].rpartition("/")
    if not slash:
        service_name, _, method_name = command[0].rpartition(".")
    try:
        method = pool.FindServiceByName(service_name).methods_by_name[method_name]
    except (KeyError, grpc.RpcError):
        return fail(f"target server does not expose service or method {command[0]!r}")
    if method.client_streaming:
        usage(f"{command[0]} is client-streaming, which this stand-in does not do")
    request_class = message_factory.GetMessageClass(method.input_type)
    response_class = message_factory.GetMessageClass(method.output_type)
    try:
        # No -d: an empty request, as grpcurl sends.
        request = json_format.Parse(data or "{}", request_class(), descriptor_pool=pool)
    except json_format.ParseError as error:
        return fail(f"error getting request data for {command[0]}: {error}")

    path = f"/{service_name}/{method_name}"
    call = channel.unary_stream if method.server_streaming else channel.unary_unary
    stub = call(
        path,
        request_serializer=request_class.SerializeToString,
        response_deserializer=response_class.FromString,
    )
    try:
        if method.server_streaming:
            for response in stub(request, metadata=headers):
                print(json_format.MessageToJson(response, indent=2), flush=True)
        else:
            response = stub(request, metadata=headers)
            print(json_format.MessageToJson(response, indent=2), flush=True)
    except grpc.RpcError as error:
        print_error(error, pool)
        return 64 + error.code().value[0]
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
