"""The error bodies each service answers with, raised as ApiError from any route."""


class ApiError(Exception):
    def __init__(self, status, body):
        super().__init__(status)
        self.status = status
        self.body = body


def blazar_error(status, message):
    return ApiError(status, {"error_code": status, "error_message": message, "error_name": status})


def placement_error(status, title, detail, code="placement.undefined_code"):
    return ApiError(status, {"errors": [{"status": status, "title": title, "detail": detail,
                                         "code": code}]})


def keystone_error(status, message):
    titles = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found"}
    return ApiError(status, {"error": {"code": status, "title": titles.get(status, "Error"),
                                       "message": message}})


def nova_error(status, message):
    keys = {400: "badRequest", 403: "forbidden", 404: "itemNotFound", 409: "conflictingRequest"}
    return ApiError(status, {keys.get(status, "computeFault"): {"code": status, "message": message}})


def neutron_error(status, kind, message):
    return ApiError(status, {"NeutronError": {"type": kind, "message": message, "detail": ""}})


def cinder_error(status, message):
    keys = {400: "badRequest", 404: "itemNotFound"}
    return ApiError(status, {keys.get(status, "computeFault"): {"code": status, "message": message}})
