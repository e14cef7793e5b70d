"""Token API: exchange a password for a token (guarded against guessing), list and revoke my
own tokens. Under /api/v1/auth/."""

from django.contrib.auth import authenticate
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import permissions, serializers, status
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from accounts import services
from accounts.models import ApiToken
from config import login_guard
from config.errors import DomainError, ErrorCode


class TooManyAttempts(DomainError):
    http_status = 429


class CredentialsSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=4096, trim_whitespace=False)
    name = serializers.CharField(max_length=100, required=False, allow_blank=True)


class IssuedTokenSerializer(serializers.Serializer):
    token = serializers.CharField()
    id = serializers.IntegerField()
    expires_at = serializers.DateTimeField(allow_null=True)


class ApiTokenSerializer(serializers.ModelSerializer):
    class Meta:
        model = ApiToken
        fields = ["id", "name", "key_prefix", "created_at", "last_used_at", "expires_at"]


class TokenView(APIView):
    """Exchange a username and password for a new API token (the key is shown once)."""

    authentication_classes: list = []
    permission_classes = [permissions.AllowAny]
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "auth"

    @extend_schema(request=CredentialsSerializer, responses={200: IssuedTokenSerializer}, auth=[])
    def post(self, request):
        form = CredentialsSerializer(data=request.data)
        if not form.is_valid():
            raise DomainError(ErrorCode.INVALID, "Send a username and a password.")
        username, password = form.validated_data["username"], form.validated_data["password"]
        if login_guard.locked_out(request, username):
            raise TooManyAttempts("rate_limited", login_guard.LOCKED_MESSAGE)
        user = authenticate(request, username=username, password=password)
        if user is None or not user.is_active:
            login_guard.record_failure(request, username)
            raise DomainError(ErrorCode.INVALID_CREDENTIALS, "Unknown username or wrong password.")
        login_guard.record_success(request, username)
        token, key = services.api_token_issue(user=user, now=timezone.now(), name=form.validated_data.get("name", ""))
        return Response({"token": key, "id": token.pk, "expires_at": token.expires_at})


class TokenListView(APIView):
    @extend_schema(responses={200: ApiTokenSerializer(many=True)})
    def get(self, request):
        return Response(ApiTokenSerializer(services.api_tokens_of(user=request.user), many=True).data)


class TokenDetailView(APIView):
    @extend_schema(request=None, responses={204: None})
    def delete(self, request, pk: int):
        services.api_token_revoke(user=request.user, token_id=pk, now=timezone.now())
        return Response(status=status.HTTP_204_NO_CONTENT)
