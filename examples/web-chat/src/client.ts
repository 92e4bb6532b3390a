// The sessionstore client for the page: gRPC-Web over fetch, with the
// bearer token on every call, and readable errors.

import { BinaryReader, WireType } from "@bufbuild/protobuf/wire";
import { Code, ConnectError, createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createGrpcWebTransport } from "@connectrpc/connect-web";

import { SessionStore } from "./gen/sessionstore/v1/sessionstore_pb.js";

export type SessionStoreClient = Client<typeof SessionStore>;

/** A client of the sessionstore server at `server` (e.g. http://127.0.0.1:50051). */
export function connect(server: string, token: string): SessionStoreClient {
  const bearer: Interceptor = (next) => (request) => {
    if (token !== "") {
      request.header.set("authorization", `Bearer ${token}`);
    }
    return next(request);
  };
  const transport = createGrpcWebTransport({
    baseUrl: server.replace(/\/+$/, ""),
    interceptors: [bearer],
  });
  return createClient(SessionStore, transport);
}

/** What went wrong, as the page shows it. */
export interface Failure {
  /** The gRPC code's name, e.g. "Unauthenticated". */
  code: string;
  /** The server's message (grpc-message). */
  message: string;
  /** The ErrorInfo reason from grpc-status-details-bin, e.g. "RUN_NOT_ACTIVE", or "". */
  reason: string;
}

export function failure(error: unknown): Failure {
  const connectError = ConnectError.from(error);
  return {
    code: Code[connectError.code] ?? String(connectError.code),
    message: connectError.rawMessage,
    reason: errorReason(connectError),
  };
}

export function isCanceled(error: unknown): boolean {
  return ConnectError.from(error).code === Code.Canceled;
}

/**
 * The `reason` of the google.rpc.ErrorInfo the server puts in its error
 * details (the `grpc-status-details-bin` header, which the server's CORS
 * policy exposes to the page). ErrorInfo's field 1 is the reason; reading
 * it needs no generated code for google/rpc.
 */
export function errorReason(error: ConnectError): string {
  for (const detail of error.details) {
    if (!("type" in detail) || detail.type !== "google.rpc.ErrorInfo") {
      continue;
    }
    const reader = new BinaryReader(detail.value);
    while (reader.pos < reader.len) {
      const [field, wireType] = reader.tag();
      if (field === 1 && wireType === WireType.LengthDelimited) {
        return reader.string();
      }
      reader.skip(wireType);
    }
  }
  return "";
}
