from django.apps import AppConfig


class TrainingConfig(AppConfig):
    name = "training"
    verbose_name = "Training jobs and runs"

    def ready(self) -> None:
        # The calendar names the job each booking will run; reservations may not import
        # training (DESIGN.md), so training hands it the reader.
        from reservations import calendar_feed
        from training.selectors import booking_job_details

        if booking_job_details not in calendar_feed.booking_details:
            calendar_feed.booking_details.append(booking_job_details)
