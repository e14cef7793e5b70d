"""REST API for notifications: my preferences, and my teams' webhooks (managers and admins).

Mounted by the lead under /api/v1/notifications/ (notifications/api_urls.py). Views parse,
call one service, render; permissions live in the services."""

from django.db.models import Q
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from config.errors import NotFound
from notifications import services
from notifications.models import EventType, NotificationPreference, Webhook


class PreferenceSerializer(serializers.Serializer):
    email_enabled = serializers.BooleanField(required=False)
    muted_events = serializers.ListField(child=serializers.ChoiceField(EventType.choices), required=False)
    event_types = serializers.SerializerMethodField(help_text="Every event type there is.")

    def get_event_types(self, _preference) -> list[str]:
        return list(EventType.values)


class WebhookSerializer(serializers.ModelSerializer):
    events = serializers.ListField(
        child=serializers.ChoiceField(EventType.choices), required=False, help_text="Empty: every event type."
    )
    rotate_secret = serializers.BooleanField(required=False, write_only=True)

    class Meta:
        model = Webhook
        fields = ["id", "team", "url", "description", "events", "enabled", "secret", "created_at", "rotate_secret"]
        read_only_fields = ["id", "secret", "created_at"]


class PreferenceView(APIView):
    @extend_schema(responses={200: PreferenceSerializer})
    def get(self, request):
        preference = NotificationPreference.objects.filter(user=request.user).first() or NotificationPreference()
        return Response(PreferenceSerializer(preference).data)

    @extend_schema(request=PreferenceSerializer, responses={200: PreferenceSerializer})
    def patch(self, request):
        form = PreferenceSerializer(data=request.data, partial=True)
        form.is_valid(raise_exception=True)
        preference = services.preference_update(user=request.user, **form.validated_data)
        return Response(PreferenceSerializer(preference).data)

    put = patch


class WebhookViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Webhooks of the teams I manage (admins: all). Members see none: the secret is the
    team's, and only managers hold it."""

    serializer_class = WebhookSerializer
    lookup_value_regex = "[0-9]{1,18}"  # anything else is no webhook: the API's 404, not a 500

    def get_queryset(self):
        user = self.request.user
        queryset = Webhook.objects.order_by("team_id", "id")
        if user.is_superuser:
            return queryset
        return queryset.filter(Q(team__memberships__user=user, team__memberships__role="manager"))

    def get_object(self):
        webhook = self.get_queryset().filter(pk=self.kwargs["pk"]).first()
        if webhook is None:
            raise NotFound("not_found", "Not found.")
        return webhook

    @extend_schema(request=WebhookSerializer, responses={201: WebhookSerializer})
    def create(self, request):
        form = WebhookSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        webhook = services.webhook_create(
            actor=request.user,
            team_id=data["team"].pk,
            url=data["url"],
            events=data.get("events", []),
            description=data.get("description", ""),
        )
        return Response(WebhookSerializer(webhook).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=WebhookSerializer, responses={200: WebhookSerializer})
    def partial_update(self, request, pk=None):
        webhook = self.get_object()
        form = WebhookSerializer(webhook, data=request.data, partial=True)
        form.is_valid(raise_exception=True)
        changes = {key: value for key, value in form.validated_data.items() if key != "team"}
        webhook = services.webhook_update(actor=request.user, webhook=webhook, changes=changes)
        return Response(WebhookSerializer(webhook).data)

    def destroy(self, request, pk=None):
        services.webhook_delete(actor=request.user, webhook=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
